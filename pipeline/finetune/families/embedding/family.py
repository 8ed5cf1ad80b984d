"""Embedding fine-tuning as a task family: the five configs' data, how a split is scored, the loss, the batches.

    embed-pairs   (query, positive[, negative]): in-batch negatives (plus the hard negative where a pair has one),
                  scored by retrieval nDCG@10 on the split's pairs (`evaluation.RetrievalTask`), and fused with
                  BM25 (`hybrid_ndcg_at_10`, the weight cross-fitted on the split's queries: `retrieval/figures.py`)
    embed-sts     (sentence1, sentence2, score): CoSENT, scored by the Spearman correlation of cosine
    embed-simcse  (text,): unsupervised SimCSE (Gao et al. 2021), each text its own positive under two dropout
                  masks; scored by retrieval nDCG@10 of each held-out text's first half searching for its second half
    embed-sparse  (query, positive[, negative]) as embed-pairs: SPLADE (`sparse_folder.py`), in-batch negatives on
                  dot products of sparse vectors plus FLOPS regularisers; scored by nDCG@10 of dot-product search,
                  with the active dimensions per query and per document beside it
    embed-corpus  a raw corpus: (query, positive) pairs mined from its documents (`corpus_stage.py`), trained as
                  pairs and scored by retrieval nDCG@10 on the pairs mined from the held-out documents

In-batch negatives are the cached (GradCache) form when `embedding.cache_mini_batch` is set, and their batches
come from sentence-transformers' no-duplicates sampler, so that no text is its own in-batch negative. With
`embedding.matryoshka_dims` the loss is wrapped in `MatryoshkaLoss` and the main figure is also scored on each
embedding's first components (`ndcg_at_10@64`); mined hard negatives (`hard_negatives.py`) arrive as more
columns. The family's trainer is `tuner.EmbeddingTuner` (sentence-transformers' trainer), which
`trainer.train_or_reuse` runs for it.
"""

from __future__ import annotations

import sys

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.catalog import TaskSpec
from pipeline.data.tasks.embedding_records import read_pairs, read_scored_pairs, read_texts
from pipeline.data.tasks.splits import Split, TaskData
from pipeline.finetune.families.embedding.corpus_stage import read_corpus_pairs
from pipeline.finetune.families.interface import TaskFamily

RETRIEVAL_METRICS = ("ndcg_at_10", "mrr_at_10", "recall_at_10", "recall_at_100")
KINDS = {"embed-pairs": "pairs", "embed-sts": "sts", "embed-simcse": "simcse", "embed-sparse": "sparse",
         "embed-corpus": "corpus"}
COLUMNS = {"pairs": ("query", "positive", "negative"), "sts": ("sentence1", "sentence2"), "simcse": ("text",),
           "sparse": ("query", "positive", "negative"), "corpus": ("query", "positive")}
PAIRED = ("pairs", "sparse", "corpus")
"""Kinds whose splits are (query, positive[, negative]) pairs, trained and scored as they are."""
SPARSE_FIGURES = ("query_active_dims", "document_active_dims")
HYBRID_FIGURES = ("hybrid_ndcg_at_10", "hybrid_weight")
"""`embed-pairs`' figures of the model fused with BM25 (`hub.retrieval.figures.hybrid_figures`)."""
"""`embed-sparse`'s figures beside the search metrics (`hub.retrieval.sparse_scoring.ACTIVE_DIMS`)."""
MIN_HALF_WORDS = 2
"""Words a SimCSE text needs on each side of its middle to be a held-out search (shorter texts are left out)."""


def load_embedding_task(config) -> TaskData:
    """The task's train, dev (and test) files, each checked line by line (`records.py`)."""
    kind, d = KINDS[config.task], config.data
    read = {"pairs": read_pairs, "sparse": read_pairs, "simcse": read_texts,
            "sts": lambda path: read_scored_pairs(path, config.embedding.score_range),
            "corpus": lambda path: read_corpus_pairs(path, config)}[kind]
    train = read(d.train_file)
    if d.max_train_examples:
        n = d.max_train_examples
        train = Split(train.source, train.texts[:n], train.labels[:n] if train.labels else None, train.ids[:n])
    dev = {"dev": read(d.validation_file)}
    test = {"test": read(d.test_file)} if d.test_file else {}
    metrics = ("spearman",) if kind == "sts" else RETRIEVAL_METRICS
    metrics += ("zero_shot_" + metrics[0],) + (("bm25_" + metrics[0],) if kind != "sts" else ())
    metrics += SPARSE_FIGURES if kind == "sparse" else ()
    metrics += HYBRID_FIGURES if kind == "pairs" else ()
    metrics += tuple(f"{metrics[0]}@{dim}" for dim in config.embedding.matryoshka_dims or ())
    return TaskData(TaskSpec(config.task, COLUMNS[kind], "score" if kind == "sts" else None, None, metrics),
                    train, dev, test)


def text_halves(split: Split) -> Split:
    """Each text of at least 2 × `MIN_HALF_WORDS` words as a pair: its first half is the query, its second the
    positive (SimCSE's held-out score: text alone says nothing else about what a good embedding is)."""
    pairs = Split(f"{split.source} (first half → second half)")
    for texts, key in zip(split.texts, split.ids, strict=True):
        words = texts[0].split()
        if len(words) >= 2 * MIN_HALF_WORDS:
            middle = len(words) // 2
            pairs.texts.append((" ".join(words[:middle]), " ".join(words[middle:])))
            pairs.ids.append(key)
    if not pairs.texts:
        raise PipelineError(f"{split.source}: no text has {2 * MIN_HALF_WORDS} words or more; SimCSE scores a "
                            "held-out text's first half searching for its second")
    return pairs


def pair_columns(size: int) -> tuple[str, ...]:
    """The training columns of a row of `size` texts: anchor, positive, then `negative` or `negative_1`, …"""
    negatives = ("negative",) if size == 3 else tuple(f"negative_{i}" for i in range(1, size - 1))
    return ("anchor", "positive") + negatives


def group_name(size: int) -> str:
    return {2: "pairs", 3: "with_negative"}.get(size, f"with_{size - 2}_negatives")


def remembered(encode):
    """`encode` computing each list of texts once (the full and the truncated figures share the embeddings)."""
    seen = {}

    def encode_once(texts):
        key = tuple(texts)
        if key not in seen:
            seen[key] = encode(texts)
        return seen[key]

    return encode_once


def truncated(encode, dim: int):
    """`encode` keeping the first `dim` components (a Matryoshka model's short embedding)."""
    return lambda texts: encode(texts)[:, :dim]


class EmbeddingFamily(TaskFamily):
    """The per-family parts of embedding fine-tuning; the training itself is `loop/embedding_tuner.py`'s."""

    task_type = "embedding"

    def __init__(self, data: TaskData, options=None):
        self.spec, self.kind = data.spec, KINDS[data.spec.name]
        self.dims = [int(name.rpartition("@")[2]) for name in self.spec.metrics if "@" in name]
        """The widths the main figure is also scored at (`embedding.matryoshka_dims`: its metrics `<main>@<width>`)."""

    def score(self, encode, split: Split, documents=None) -> dict[str, float]:
        """The split's figures under `encode` (the first is the main metric); a search's corpus through `documents`
        where given (the document prompt's encoder); the main figure again on the first `self.dims` components."""
        from pipeline.hub.embedding_evaluation import score_retrieval, score_sts

        def figures(encode, documents):
            if self.kind == "sts":
                return score_sts(encode, split)
            if self.kind == "sparse":
                from pipeline.hub.retrieval.sparse_scoring import score_sparse_retrieval

                return score_sparse_retrieval(encode, split)
            if self.kind == "pairs" and len(split) > 1:  # the model beside BM25 and fused with it
                from pipeline.hub.retrieval.figures import hybrid_figures

                return hybrid_figures(split, encode, documents)
            return score_retrieval(encode, split if self.kind in PAIRED else text_halves(split), documents)

        if not self.dims:
            return figures(encode, documents)
        encode, documents = remembered(encode), remembered(documents) if documents else None
        out, main = figures(encode, documents), self.main_metric
        for dim in self.dims:
            out[f"{main}@{dim}"] = figures(truncated(encode, dim), documents and truncated(documents, dim))[main]
        return out

    def bm25(self, split: Split) -> dict[str, float]:
        """BM25's figures on the split (retrieval kinds; STS has none)."""
        from pipeline.hub.embedding_evaluation import RetrievalTask

        if self.kind == "sts":
            return {}
        task = RetrievalTask.of(split if self.kind in PAIRED else text_halves(split))
        return task.metrics(task.bm25_scores())

    def training_sets(self, split: Split):
        """The split as sentence-transformers' training data: one dataset, or pairs with and without a hard
        negative as two (their columns differ; batches are drawn from each in proportion)."""
        from datasets import Dataset

        first = [t[0] for t in split.texts]
        if self.kind == "sts":
            return Dataset.from_dict({"sentence1": first, "sentence2": [t[1] for t in split.texts],
                                      "score": [float(s) for s in split.labels]})
        if self.kind == "simcse":
            return Dataset.from_dict({"anchor": first, "positive": first})
        groups = {}
        for texts in split.texts:
            groups.setdefault(len(texts), []).append(texts)
        sets = {group_name(size): Dataset.from_dict({name: [row[i] for row in rows]
                                                     for i, name in enumerate(pair_columns(size))})
                for size, rows in sorted(groups.items())}
        if len(sets) > 1:
            print(f"{split.source}: {len(split) - len(groups.get(2, []))} of {len(split)} pairs have hard negatives; "
                  f"each count of negatives is batched apart", file=sys.stderr, flush=True)
        return sets if len(sets) > 1 else next(iter(sets.values()))

    def loss(self, model, embedding):
        """CoSENT for scored pairs; SPLADE's for sparse ones; in-batch negatives (cached with
        `embedding.cache_mini_batch`) otherwise; either of the last two inside `MatryoshkaLoss` with
        `embedding.matryoshka_dims` (at those widths and the full one)."""
        from sentence_transformers.sentence_transformer import losses

        if self.kind == "sparse":
            from pipeline.finetune.families.embedding.sparse_folder import splade_loss

            return splade_loss(model, embedding)
        if self.kind == "sts":
            loss = losses.CoSENTLoss(model, scale=embedding.scale)
        elif embedding.cache_mini_batch:
            loss = losses.CachedMultipleNegativesRankingLoss(model, scale=embedding.scale,
                                                             mini_batch_size=embedding.cache_mini_batch)
        else:
            loss = losses.MultipleNegativesRankingLoss(model, scale=embedding.scale)
        if not embedding.matryoshka_dims:
            return loss
        width = model.get_embedding_dimension()
        return losses.MatryoshkaLoss(model, loss, sorted({width, *embedding.matryoshka_dims}, reverse=True))

    def loss_name(self, embedding) -> str:
        if self.kind == "sparse":
            return "SpladeLoss(SparseMultipleNegativesRankingLoss)"
        name = "CoSENTLoss" if self.kind == "sts" else \
            f"{'Cached' if embedding.cache_mini_batch else ''}MultipleNegativesRankingLoss"
        return f"MatryoshkaLoss({name})" if embedding.matryoshka_dims else name

    @property
    def no_duplicates(self) -> bool:
        """In-batch negatives need batches without repeated texts (a repeat would be a false negative)."""
        return self.kind != "sts"

    def provenance(self) -> dict:
        return {"task": self.spec.name, "task_type": self.task_type, "labels": [], "kind": self.kind}
