"""A model's search scores fused with BM25's, two ways:

- **weighted:** each query's scores z-normalised over the corpus (its mean subtracted, divided by its standard
  deviation; a query whose scores are all equal, such as BM25's for a query with no corpus word, gives zeros), then
  `weight · z(model) + (1 − weight) · z(BM25)`: weight 1 is the model alone, 0 BM25 alone. The weight is chosen from
  `WEIGHTS` by nDCG@10 on held-out queries (`choose_weight`; a tie goes to the weight nearest an even mix).
- **reciprocal rank fusion** (Cormack et al. 2009), k = 60: each document scores Σ 1 / (k + rank) over the rankers
  whose top `RRF_DEPTH` it is in (BM25 ranks only the documents it matches at all). Nothing is fitted.
"""

from __future__ import annotations

import numpy as np

WEIGHTS = tuple(i / 10 for i in range(11))
"""The model's weights tried, 0 to 1 in steps of 0.1."""
RRF_K = 60
RRF_DEPTH = 100
"""Each ranker's documents that count in reciprocal rank fusion (the evaluator's deepest cut, Recall@100)."""


def z_normalised(scores: np.ndarray) -> np.ndarray:
    """Each row minus its mean, over its standard deviation (a constant row: zeros)."""
    scores = np.asarray(scores, dtype=np.float64)
    spread = scores.std(1, keepdims=True)
    return np.divide(scores - scores.mean(1, keepdims=True), spread, out=np.zeros_like(scores), where=spread > 0)


def weighted_fusion(model: np.ndarray, bm25: np.ndarray, weight: float) -> np.ndarray:
    """`weight · z(model) + (1 − weight) · z(BM25)`, per query."""
    if not 0 <= weight <= 1:
        raise ValueError(f"weight {weight}: expected a number from 0 (BM25 alone) to 1 (the model alone)")
    return weight * z_normalised(model) + (1 - weight) * z_normalised(bm25)


def _reciprocal_ranks(scores: np.ndarray, depth: int, matched_only: bool) -> np.ndarray:
    out = np.zeros(scores.shape, dtype=np.float64)
    depth = min(depth, scores.shape[1])
    order = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
    rows = np.arange(scores.shape[0])[:, None]
    contribution = np.broadcast_to(1.0 / (RRF_K + np.arange(1, depth + 1)), order.shape)
    if matched_only:
        contribution = np.where(scores[rows, order] > 0, contribution, 0.0)
    out[rows, order] = contribution
    return out


def rrf_fusion(model: np.ndarray, bm25: np.ndarray, depth: int = RRF_DEPTH) -> np.ndarray:
    """Reciprocal rank fusion of the model's and BM25's rankings."""
    return _reciprocal_ranks(model, depth, False) + _reciprocal_ranks(bm25, depth, True)


def choose_weight(ndcg_of) -> float:
    """The weight of `WEIGHTS` whose nDCG@10 (`ndcg_of(weight)`) is highest; a tie goes to the nearest to 0.5."""
    scored = [(ndcg_of(w), -abs(w - 0.5), w) for w in WEIGHTS]
    return max(scored)[2]
