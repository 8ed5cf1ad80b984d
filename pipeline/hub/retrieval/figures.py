"""The evaluator's figures beside each retrieval file's search: the corpus's geometry, and with `--hybrid` the
model fused with BM25 (`fusion.py`), under `retrieval/<name>/geometry/…`, `…/hybrid/…` and `…/hybrid_rrf/…`.

The weighted fusion's weight is chosen on held-out queries: those of a separate pairs file when one is given
(`--hybrid-select`; it may share no query with a reported file), else by two-fold cross-fitting: the file's queries
are split into two seeded halves, and each half is fused with the weight chosen on the other, so every query is
reported once, by a weight chosen without it, and the fused figures cover the same queries as the model's and
BM25's. `hybrid/weight` is the chosen weight (with cross-fitting, the mean of the two halves'); `notes` says how.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.splits import Split
from pipeline.hub.embedding_evaluation import Encode, Probes, RetrievalTask, cosine_scores
from pipeline.hub.retrieval.fusion import choose_weight, rrf_fusion, weighted_fusion
from pipeline.hub.retrieval.geometry import embedding_geometry

SEED = 0
"""The seed of the cross-fitting's split of a file's queries into halves."""


class RememberingEncode:
    """`encode` that embeds each distinct text once: the geometry and the fusion reuse the search's vectors."""

    def __init__(self, encode: Encode):
        self.encode, self.seen = encode, {}

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        new = [t for t in dict.fromkeys(texts) if t not in self.seen]
        if new:
            self.seen.update(zip(new, self.encode(new), strict=True))
        if not texts:
            return self.encode([])
        return np.stack([self.seen[t] for t in texts])


def search_scores(queries: Encode, documents: Encode, task: RetrievalTask) -> np.ndarray:
    """The task's (queries × corpus) cosines, queries and documents each through their own encoder."""
    return cosine_scores(queries(task.queries), documents(task.corpus))


def query_subset(task: RetrievalTask, rows: np.ndarray) -> RetrievalTask:
    return RetrievalTask([task.queries[i] for i in rows], task.corpus, [task.relevant[i] for i in rows])


@dataclass
class Searched:
    """A retrieval file's task with BM25's scores (computed once, whatever the model)."""

    task: RetrievalTask
    bm25: np.ndarray

    @classmethod
    def of(cls, pairs: Split) -> Searched:
        task = RetrievalTask.of(pairs)
        return cls(task, task.bm25_scores())

    def best_weight(self, model: np.ndarray, rows: np.ndarray | None = None) -> float:
        task, model, bm25 = self.task, model, self.bm25
        if rows is not None:
            task, model, bm25 = query_subset(task, rows), model[rows], bm25[rows]
        return choose_weight(lambda w: task.metrics(weighted_fusion(model, bm25, w))["ndcg_at_10"])


@dataclass
class RetrievalExtras:
    """Geometry (always) and fusion (with `hybrid`) for every retrieval file of `probes`; files are checked and BM25
    run when built, before any model loads."""

    probes: Probes
    hybrid: bool = False
    select: Split | None = None
    searched: dict[str, Searched] = field(init=False, default_factory=dict)
    held_out: Searched | None = field(init=False, default=None)
    notes: list[str] = field(init=False, default_factory=list)

    def __post_init__(self):
        if self.select is not None and not self.hybrid:
            raise PipelineError("--hybrid-select: give --hybrid too")
        if self.hybrid and not self.probes.retrieval:
            raise PipelineError("--hybrid fuses a search with BM25's: give --retrieval")
        if not self.hybrid:
            return
        self.searched = {name: Searched.of(pairs) for name, pairs in self.probes.retrieval.items()}
        if self.select is not None:
            self.held_out = Searched.of(self.select)
            for name, searched in self.searched.items():
                shared = set(searched.task.queries) & set(self.held_out.task.queries)
                if shared:
                    raise PipelineError(f"--hybrid-select {self.select.source}: {len(shared)} of its queries are also "
                                        f"in {self.probes.retrieval[name].source} (e.g. {sorted(shared)[0]!r}); the "
                                        "weight must be chosen on queries the report does not score")
        else:
            for name, searched in self.searched.items():
                if len(searched.task.queries) < 2:
                    raise PipelineError(f"--hybrid: {self.probes.retrieval[name].source} has one query; choosing "
                                        "the weight on held-out queries needs two, or a --hybrid-select file")

    def figures(self, queries: Encode, documents: Encode | None = None) -> dict[str, float]:
        """`retrieval/<name>/geometry/…`, and with `hybrid` `…/hybrid/…` and `…/hybrid_rrf/…`; queries embedded by
        `queries`, documents by `documents` (a document prompt's encoder; default `queries`)."""
        documents = documents or queries
        self.notes = []
        out = {}
        chosen = None
        if self.held_out is not None:
            chosen = self.held_out.best_weight(search_scores(queries, documents, self.held_out.task))
            self.notes.append(f"hybrid: weight {chosen:.1f} (the model's share) chosen on {self.select.source} "
                              f"({len(self.held_out.task.queries)} queries)")
        for name, pairs in self.probes.retrieval.items():
            task = self.searched[name].task if name in self.searched else RetrievalTask.of(pairs)
            scores = search_scores(queries, documents, task)
            geometry = embedding_geometry(documents(task.corpus), scores)
            out.update({f"retrieval/{name}/geometry/{k}": v for k, v in geometry.items()})
            if self.hybrid:
                out.update({f"retrieval/{name}/{k}": v for k, v in self.fused(name, scores, chosen).items()})
        return out

    def fused(self, name: str, model: np.ndarray, chosen: float | None) -> dict[str, float]:
        searched = self.searched[name]
        if chosen is not None:
            figures = searched.task.metrics(weighted_fusion(model, searched.bm25, chosen))
            weight = chosen
        else:
            figures, weights = cross_fitted(searched, model)
            weight = float(np.mean(weights))
            self.notes.append(f"hybrid {name}: weights {weights[0]:.1f} and {weights[1]:.1f} (the model's share), "
                              f"each chosen on the other half of the file's {len(searched.task.queries)} queries "
                              f"(seed {SEED})")
        return {**{f"hybrid/{k}": v for k, v in figures.items()}, "hybrid/weight": weight,
                **{f"hybrid_rrf/{k}": v for k, v in searched.task.metrics(rrf_fusion(model, searched.bm25)).items()}}


def cross_fitted(searched: Searched, model: np.ndarray) -> tuple[dict[str, float], list[float]]:
    """The weighted fusion's figures on every query of `searched`, each half of the queries (seeded) fused with the
    weight chosen on the other half; and the two weights."""
    task, bm25 = searched.task, searched.bm25
    order = np.random.default_rng(SEED).permutation(len(task.queries))
    halves = order[: len(order) // 2], order[len(order) // 2:]
    fused, weights = np.zeros(model.shape), []
    for rows, other in (halves, halves[::-1]):
        weights.append(searched.best_weight(model, other))
        fused[rows] = weighted_fusion(model[rows], bm25[rows], weights[-1])
    return task.metrics(fused), weights


def hybrid_figures(pairs: Split, queries: Encode, documents: Encode | None = None) -> dict[str, float]:
    """A pairs split's search figures, and the model fused with BM25 (weights cross-fitted on the split's own
    queries, as `roberta-embed-eval --hybrid` without a selection file): `hybrid_<metric>` and `hybrid_weight`."""
    searched = Searched.of(pairs)
    model = search_scores(queries, documents or queries, searched.task)
    fused, weights = cross_fitted(searched, model)
    return {**searched.task.metrics(model), **{f"hybrid_{k}": v for k, v in fused.items()},
            "hybrid_weight": float(np.mean(weights))}
