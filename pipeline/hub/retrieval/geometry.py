"""The geometry of a corpus's embeddings, printed beside every zero-shot search figure: how alike the vectors point,
how many directions they spread over, and whether a few documents are everyone's nearest neighbour.

- `mean_cosine` (anisotropy): the mean cosine over every pair of distinct corpus embeddings (1: all parallel, 0 on
  average for directions spread evenly). Computed exactly from the sum of the unit vectors, without the n × n matrix.
- `effective_rank`: the entropy effective rank of Roy & Vetterli (2007), exp(H(p)) with p the singular values of
  the centred embeddings (each minus the corpus mean, as they are, not normalised) divided by their sum: 1 when the
  vectors vary along one direction (parallel vectors of different lengths), k when along k directions equally
  (vectors ±e_1 … ±e_k), at most min(n − 1, width) for n vectors (centring takes one: n orthogonal vectors give
  n − 1); 0 when they do not vary at all.
- `hubness`: the share of the queries whose top-1 document (by cosine) is the single most frequent top-1 document
  (1/queries when every query finds a different one; 1 when one hub is every query's answer).
"""

from __future__ import annotations

import numpy as np

from pipeline.hub.embedding_evaluation import unit

NO_SPREAD = 1e-6
"""Singular values summing below this fraction of the embeddings' norm count as no variation at all."""


def mean_cosine(vectors: np.ndarray) -> float:
    """The mean cosine over all pairs of distinct rows: (|Σ u|² − n) / (n (n − 1)) for unit rows u."""
    units = unit(np.asarray(vectors, dtype=np.float64))
    n = len(units)
    if n < 2:
        return float("nan")
    total = units.sum(0)
    return float((total @ total - (units * units).sum()) / (n * (n - 1)))


def effective_rank(vectors: np.ndarray) -> float:
    """Roy & Vetterli's entropy effective rank of the centred rows."""
    vectors = np.asarray(vectors, dtype=np.float64)
    singular = np.linalg.svd(vectors - vectors.mean(0), compute_uv=False)
    total = singular.sum()
    if total <= NO_SPREAD * max(np.linalg.norm(vectors), 1e-12):
        return 0.0
    p = singular[singular > 0] / total
    return float(np.exp(-(p * np.log(p)).sum()))


def hubness(scores: np.ndarray) -> float:
    """The largest share of queries (rows of a queries × corpus score matrix) sharing one top-1 document."""
    if scores.size == 0:
        return float("nan")
    return float(np.bincount(scores.argmax(1)).max() / scores.shape[0])


def embedding_geometry(corpus: np.ndarray, scores: np.ndarray | None = None) -> dict[str, float]:
    """`mean_cosine` and `effective_rank` of the corpus embeddings, and `hubness` of a search's scores when given."""
    figures = {"mean_cosine": mean_cosine(corpus), "effective_rank": effective_rank(corpus)}
    if scores is not None:
        figures["hubness"] = hubness(scores)
    return figures
