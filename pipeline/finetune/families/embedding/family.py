"""Embedding fine-tuning as a task family: the three configs' data, how a split is scored, the loss, the batches.

    embed-pairs   (query, positive[, negative]): in-batch negatives (plus the hard negative where a pair has one),
                  scored by retrieval nDCG@10 on the split's pairs (`evaluation.RetrievalTask`)
    embed-sts     (sentence1, sentence2, score): CoSENT, scored by the Spearman correlation of cosine
    embed-simcse  (text,): unsupervised SimCSE (Gao et al. 2021), each text its own positive under two dropout
                  masks; scored by retrieval nDCG@10 of each held-out text's first half searching for its second half
    embed-corpus  a raw corpus: (query, positive) pairs mined from its documents (`corpus_stage.py`), trained as
                  pairs and scored by retrieval nDCG@10 on the pairs mined from the held-out documents

In-batch negatives are the cached (GradCache) form when `embedding.cache_mini_batch` is set, and their batches
come from sentence-transformers' no-duplicates sampler, so that no text is its own in-batch negative. The family's
trainer is `tuner.EmbeddingTuner` (sentence-transformers' trainer), which `trainer.train_or_reuse` runs for it.
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
KINDS = {"embed-pairs": "pairs", "embed-sts": "sts", "embed-simcse": "simcse", "embed-corpus": "corpus"}
COLUMNS = {"pairs": ("query", "positive", "negative"), "sts": ("sentence1", "sentence2"), "simcse": ("text",),
           "corpus": ("query", "positive")}
PAIRED = ("pairs", "corpus")
"""Kinds whose splits are (query, positive[, negative]) pairs, trained and scored as they are."""
MIN_HALF_WORDS = 2
"""Words a SimCSE text needs on each side of its middle to be a held-out search (shorter texts are left out)."""


def load_embedding_task(config) -> TaskData:
    """The task's train, dev (and test) files, each checked line by line (`records.py`)."""
    kind, d = KINDS[config.task], config.data
    read = {"pairs": read_pairs, "sts": lambda path: read_scored_pairs(path, config.embedding.score_range),
            "simcse": read_texts, "corpus": lambda path: read_corpus_pairs(path, config)}[kind]
    train = read(d.train_file)
    if d.max_train_examples:
        n = d.max_train_examples
        train = Split(train.source, train.texts[:n], train.labels[:n] if train.labels else None, train.ids[:n])
    dev = {"dev": read(d.validation_file)}
    test = {"test": read(d.test_file)} if d.test_file else {}
    metrics = ("spearman",) if kind == "sts" else RETRIEVAL_METRICS
    metrics += ("zero_shot_" + metrics[0],) + (("bm25_" + metrics[0],) if kind != "sts" else ())
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


class EmbeddingFamily(TaskFamily):
    """The per-family parts of embedding fine-tuning; the training itself is `loop/embedding_tuner.py`'s."""

    task_type = "embedding"

    def __init__(self, data: TaskData, options=None):
        self.spec, self.kind = data.spec, KINDS[data.spec.name]

    def score(self, encode, split: Split) -> dict[str, float]:
        """The split's figures under `encode` (the first is the main metric)."""
        from pipeline.hub.embedding_evaluation import score_retrieval, score_sts

        if self.kind == "sts":
            return score_sts(encode, split)
        return score_retrieval(encode, split if self.kind in PAIRED else text_halves(split))

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
        columns = ("anchor", "positive", "negative")
        sets = {("pairs", "with_negative")[size - 2]: Dataset.from_dict(
                    {name: [row[i] for row in rows] for i, name in enumerate(columns[:size])})
                for size, rows in sorted(groups.items())}
        if len(sets) > 1:
            print(f"{split.source}: {len(groups[3])} of {len(split)} pairs have a hard negative; the two kinds are "
                  "batched apart", file=sys.stderr, flush=True)
        return sets if len(sets) > 1 else next(iter(sets.values()))

    def loss(self, model, embedding):
        """CoSENT for scored pairs; in-batch negatives (cached with `embedding.cache_mini_batch`) otherwise."""
        from sentence_transformers.sentence_transformer import losses

        if self.kind == "sts":
            return losses.CoSENTLoss(model, scale=embedding.scale)
        if embedding.cache_mini_batch:
            return losses.CachedMultipleNegativesRankingLoss(model, scale=embedding.scale,
                                                             mini_batch_size=embedding.cache_mini_batch)
        return losses.MultipleNegativesRankingLoss(model, scale=embedding.scale)

    def loss_name(self, embedding) -> str:
        if self.kind == "sts":
            return "CoSENTLoss"
        return "CachedMultipleNegativesRankingLoss" if embedding.cache_mini_batch else "MultipleNegativesRankingLoss"

    @property
    def no_duplicates(self) -> bool:
        """In-batch negatives need batches without repeated texts (a repeat would be a false negative)."""
        return self.kind != "sts"

    def provenance(self) -> dict:
        return {"task": self.spec.name, "task_type": self.task_type, "labels": [], "kind": self.kind}
