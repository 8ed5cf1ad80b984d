"""Embeddings scored offline: retrieval, STS, pair classification and clustering, each metric from the library
that defines it.

- retrieval (a pairs file): every query is searched by exact cosine search against every positive and negative of
  the file (deduplicated) as the corpus; nDCG@10, Recall@10 and @100 from trec_eval (pytrec-eval), MRR@10 as
  trec_eval's reciprocal rank of the top 10 (the cut BEIR applies); BM25 (bm25s) scored the same way beside it.
- STS: Spearman's rank correlation (scipy) of cosine against the gold scores, as sentence-transformers'
  `EmbeddingSimilarityEvaluator` computes it.
- pair classification: average precision (scikit-learn) of cosine against the 0/1 labels, as
  `BinaryClassificationEvaluator`'s `cosine_ap`.
- clustering: V-measure (scikit-learn) of k-means (k = the number of labels) on unit-length embeddings, as MTEB's
  clustering tasks score it.

`score_probes` is the one entry point: an `encode` function and the files, read once into `Probes`, give a flat
dict of figures (`retrieval/<name>/ndcg_at_10`, …). `probe_model` wraps a live model and tokenizer (pretraining's
in-loop probes; nothing is written). `bm25_probes` gives the lexical figures beside the retrieval ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.data.tasks.embedding_records import (
    count_truncated,
    read_clusters,
    read_labelled_pairs,
    read_pairs,
    read_scored_pairs,
    warn_truncated,
)
from pipeline.data.tasks.splits import Split
from pipeline.tracking.metrics import file_metric_name

Encode = Callable[[Sequence[str]], np.ndarray]
"""Texts → (n, width) float embeddings."""

KINDS = ("retrieval", "sts", "pair_classification", "clustering")
MAIN_SCORE = {"retrieval": "ndcg_at_10", "sts": "spearman", "pair_classification": "ap", "clustering": "v_measure"}
RETRIEVAL_DEPTH = 100
"""Documents kept per query: the deepest cut reported (Recall@100)."""


@dataclass
class Probes:
    """The evaluation files, read once: by kind, each file's name (its stem) → its records."""

    retrieval: dict[str, Split] = field(default_factory=dict)
    sts: dict[str, Split] = field(default_factory=dict)
    pair_classification: dict[str, Split] = field(default_factory=dict)
    clustering: dict[str, Split] = field(default_factory=dict)

    def items(self):
        """(kind, name, split) of every file."""
        return [(kind, name, split) for kind in KINDS for name, split in getattr(self, kind).items()]

    def texts(self) -> list[str]:
        return [t for _, _, split in self.items() for texts in split.texts for t in texts]


def read_probes(retrieval: Sequence[str | Path] = (), sts: Sequence[str | Path] = (),
                pair_classification: Sequence[str | Path] = (), clustering: Sequence[str | Path] = (),
                score_range: Sequence[float] = (0.0, 5.0)) -> Probes:
    """Every file read and checked before any model loads (a bad line stops here, naming itself)."""
    def named(paths, read):
        out = {}
        for path in paths:
            name = file_metric_name(path)
            out[name if name not in out else str(path)] = read(path)
        return out

    return Probes(named(retrieval, read_pairs), named(sts, lambda p: read_scored_pairs(p, list(score_range))),
                  named(pair_classification, read_labelled_pairs), named(clustering, read_clusters))


@dataclass(frozen=True)
class RetrievalTask:
    """A pairs file as a search task: unique queries, the corpus (every positive and negative, deduplicated), and
    which documents answer each query."""

    queries: list[str]
    corpus: list[str]
    relevant: list[set[int]]

    @classmethod
    def of(cls, pairs: Split) -> RetrievalTask:
        queries, corpus, relevant = {}, {}, []
        for texts in pairs.texts:
            q = queries.setdefault(texts[0], len(queries))
            if q == len(relevant):
                relevant.append(set())
            relevant[q].add(corpus.setdefault(texts[1], len(corpus)))
            for negative in texts[2:]:
                corpus.setdefault(negative, len(corpus))
        return cls(list(queries), list(corpus), relevant)

    def metrics(self, scores: np.ndarray) -> dict[str, float]:
        """nDCG@10, MRR@10, Recall@10 and @100 of a (queries × corpus) score matrix, from trec_eval."""
        import pytrec_eval

        depth = min(RETRIEVAL_DEPTH, scores.shape[1])
        top = np.argpartition(-scores, depth - 1, axis=1)[:, :depth]
        run = {f"q{q}": {f"d{d}": float(scores[q, d]) for d in top[q]} for q in range(len(self.queries))}
        qrels = {f"q{q}": {f"d{d}": 1 for d in docs} for q, docs in enumerate(self.relevant)}
        per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.10", "recall.100"}).evaluate(run)
        # MRR@10: trec_eval's reciprocal rank over each query's top 10 alone (0 when no answer is in it).
        top10 = {q: dict(sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))[:10]) for q, docs in run.items()}
        ranks = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)

        def mean(values) -> float:
            return float(np.mean(list(values)))

        return {"ndcg_at_10": mean(r["ndcg_cut_10"] for r in per_query.values()),
                "mrr_at_10": mean(r["recip_rank"] for r in ranks.values()),
                "recall_at_10": mean(r["recall_10"] for r in per_query.values()),
                "recall_at_100": mean(r["recall_100"] for r in per_query.values())}

    def bm25_scores(self) -> np.ndarray:
        """BM25 (`Bm25`) of every query against every document."""
        return Bm25(self.corpus).scores(self.queries)


class Bm25:
    """bm25s over `documents`, indexed once: Lucene's BM25 (k1 1.5, b 0.75) with English stop words, the lexical
    baseline of every search the pipeline scores (the evaluator, the search index, hard-negative mining)."""

    def __init__(self, documents: Sequence[str]):
        import bm25s

        corpus = bm25s.tokenize(list(documents), stopwords="en", show_progress=False)
        self.size, self.index = len(documents), None
        if corpus.vocab:  # no word of two letters or more in the corpus: nothing for BM25 to match
            self.index = bm25s.BM25()
            self.index.index(corpus, show_progress=False)

    def scores(self, queries: Sequence[str]) -> np.ndarray:
        """(queries × documents) float32; a query none of whose words is in the corpus scores 0 everywhere."""
        import bm25s

        out = np.zeros((len(queries), self.size), dtype=np.float32)
        if self.index is None:
            return out
        for q, words in enumerate(bm25s.tokenize(list(queries), stopwords="en", show_progress=False,
                                                 return_ids=False)):
            known = [w for w in words if w in self.index.vocab_dict]
            if known:
                out[q] = self.index.get_scores(known)
        return out


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cosine of each row of `a` with the same row of `b`."""
    return (unit(a) * unit(b)).sum(1)


def cosine_scores(queries: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """(queries × documents) cosine similarities: the dense search's scores."""
    return unit(queries) @ unit(documents).T


def score_retrieval(encode: Callable, pairs: Split, documents: Callable | None = None,
                    similarity: Callable = cosine_scores) -> dict[str, float]:
    """The pairs' search figures: queries encoded by `encode`, the corpus by `documents` (a document prompt's
    encoder; default `encode`), scored by `similarity` (cosine; a sparse model's dot product,
    `retrieval.sparse_scoring`)."""
    task = RetrievalTask.of(pairs)
    return task.metrics(similarity(encode(task.queries), (documents or encode)(task.corpus)))


def score_sts(encode: Encode, split: Split) -> dict[str, float]:
    from scipy.stats import spearmanr

    cosine = cosine_rows(encode([t[0] for t in split.texts]), encode([t[1] for t in split.texts]))
    return {"spearman": float(spearmanr(split.labels, cosine).statistic)}


def score_pair_classification(encode: Encode, split: Split) -> dict[str, float]:
    from sklearn.metrics import average_precision_score

    cosine = cosine_rows(encode([t[0] for t in split.texts]), encode([t[1] for t in split.texts]))
    return {"ap": float(average_precision_score(split.labels, cosine))}


def score_clustering(encode: Encode, split: Split, seed: int = 0) -> dict[str, float]:
    from sklearn.cluster import KMeans
    from sklearn.metrics import v_measure_score

    clusters = len(set(split.labels))
    found = KMeans(clusters, n_init=10, random_state=seed).fit_predict(unit(encode([t[0] for t in split.texts])))
    return {"v_measure": float(v_measure_score(split.labels, found))}


SCORERS = {"retrieval": score_retrieval, "sts": score_sts, "pair_classification": score_pair_classification,
           "clustering": score_clustering}


def score_probes(encode: Encode, probes: Probes, *, queries: Encode | None = None,
                 documents: Encode | None = None) -> dict[str, float]:
    """Every file's figures, flat: `<kind>/<name>/<metric>`; a search's queries through `queries` and its corpus
    through `documents` where given (a model's query and document prompts), every other text through `encode`."""
    def scored(kind, split):
        if kind == "retrieval":
            return score_retrieval(queries or encode, split, documents)
        return SCORERS[kind](encode, split)

    return {f"{kind}/{name}/{metric}": value for kind, name, split in probes.items()
            for metric, value in scored(kind, split).items()}


def bm25_probes(probes: Probes) -> dict[str, float]:
    """BM25's figures for every retrieval file: `retrieval/<name>/bm25/<metric>`."""
    out = {}
    for name, pairs in probes.retrieval.items():
        task = RetrievalTask.of(pairs)
        out.update({f"retrieval/{name}/bm25/{k}": v for k, v in task.metrics(task.bm25_scores()).items()})
    return out


def probe_model(model, tokenizer, probes: Probes, *, pooling: str = "mean", max_seq_len: int = 128,
                batch_size: int = 32) -> dict[str, float]:
    """The figures of a live transformers encoder (a base model, or any model whose forward returns
    `last_hidden_state`) and its tokenizer: pretraining's in-loop probes call this at each evaluation. The model
    is left in the mode it was in; nothing is written."""
    from pipeline.models.embedding_encoder import PooledEncoder

    # A model with a head (the masked-LM model pretraining trains) is read through its bare encoder.
    encoder = PooledEncoder(getattr(model, "base_model", model), tokenizer, pooling, max_seq_len, batch_size)
    return score_probes(encoder.encode, probes)


def warn_long_texts(probes: Probes, tokenizer, max_len: int) -> int:
    """Count (and warn about) the probe texts that will be cut at `max_len` tokens."""
    texts = probes.texts()
    truncated = count_truncated(tokenizer, texts, max_len)
    warn_truncated("evaluation files", truncated, len(texts), max_len)
    return truncated
