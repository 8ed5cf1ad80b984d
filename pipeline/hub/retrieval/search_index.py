"""`SearchIndex`: documents searched by a model's cosine, BM25, or both fused, as the evaluator fuses them.

    from pipeline.kit import SearchIndex
    index = SearchIndex(documents, SentenceTransformer(folder))            # or any texts → vectors function
    index.search("how do I sort a list", k=5)                              # [(doc index, score), ...]
    SearchIndex(documents, model, fusion="hybrid", weight=0.6)            # weight: the model's share
    SearchIndex(documents, model, fusion="rrf")                           # reciprocal rank fusion, k = 60

The documents are embedded once (and, for `bm25`, `hybrid` and `rrf`, indexed once by the evaluator's
`Bm25`). `hybrid` z-normalises each query's scores over the
documents and adds them with the weight (`roberta-embed-eval --hybrid` prints the weight chosen on held-out
queries); `rrf` needs no weight. The hub `Encoder` gives one too (`Encoder.search_index`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from pipeline.hub.embedding_evaluation import Bm25, unit
from pipeline.hub.retrieval.fusion import rrf_fusion, weighted_fusion

Fusion = Literal["dense", "bm25", "hybrid", "rrf"]
FUSIONS = ("dense", "bm25", "hybrid", "rrf")


@dataclass
class SearchIndex:
    """`documents` searched by `encoder` (a texts → vectors function, or anything with `.encode`, such as a
    `SentenceTransformer`), by BM25, or both (`fusion`; `weight`: the model's share in `hybrid`)."""

    documents: Sequence[str]
    encoder: Callable[[Sequence[str]], np.ndarray] | object | None = None
    fusion: Fusion = "dense"
    weight: float = 0.5
    vectors: np.ndarray | None = field(init=False, default=None, repr=False)
    bm25: Bm25 | None = field(init=False, default=None, repr=False)

    def __post_init__(self):
        problems = []
        if self.fusion not in FUSIONS:
            problems.append(f"fusion {self.fusion!r}: expected one of {', '.join(FUSIONS)}")
        if not 0 <= self.weight <= 1:
            problems.append(f"weight {self.weight}: expected the model's share, from 0 to 1")
        if self.fusion != "bm25" and self.encoder is None:
            problems.append(f"fusion {self.fusion!r} needs an encoder (a function or a model with .encode)")
        if not self.documents or any(not isinstance(d, str) for d in self.documents):
            problems.append("documents: expected a non-empty list of texts")
        if problems:
            raise ValueError("SearchIndex: " + "; ".join(problems))
        self.documents = list(self.documents)
        if self.fusion != "bm25":
            self.vectors = unit(self._encode(self.documents))
        if self.fusion != "dense":
            self.bm25 = Bm25(self.documents)

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        encode = getattr(self.encoder, "encode", self.encoder)
        return np.asarray(encode(list(texts)), dtype=np.float64)

    def scores(self, queries: Sequence[str]) -> np.ndarray:
        """(queries × documents): cosine, BM25, or their fusion."""
        model = unit(self._encode(queries)) @ self.vectors.T if self.vectors is not None else None
        if self.fusion == "dense":
            return model
        lexical = self.bm25.scores(queries)
        if self.fusion == "bm25":
            return lexical.astype(np.float64)
        return weighted_fusion(model, lexical, self.weight) if self.fusion == "hybrid" else rrf_fusion(model, lexical)

    def search_many(self, queries: Sequence[str], k: int = 10) -> list[list[tuple[int, float]]]:
        """Each query's `k` best documents, best first, as (document index, score)."""
        scores = self.scores(queries)
        k = min(k, scores.shape[1])
        out = []
        for row in scores:
            top = np.argsort(-row, kind="stable")[:k]
            out.append([(int(d), float(row[d])) for d in top])
        return out

    def search(self, query: str, k: int = 10) -> list[tuple[int, float]]:
        """The `k` best documents for `query`, best first, as (document index, score)."""
        return self.search_many([query], k)[0]
