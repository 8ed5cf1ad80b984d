"""`embed-corpus`'s splits: a raw corpus's documents (`corpus_documents.py`), the pairs mined from them
(`corpus_pairs.py`), and the rule that the training corpus fills a batch with different documents.

The validation file is the held-out documents: its pairs are mined the same way and scored by retrieval nDCG@10,
as `embed-pairs` scores its dev pairs. Every problem here surfaces when the task is read, before a model loads.
"""

from __future__ import annotations

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.corpus_documents import read_documents
from pipeline.data.tasks.corpus_pairs import mine_pairs
from pipeline.data.tasks.splits import Split


def read_corpus_pairs(path: str, config) -> Split:
    """The pairs mined from `path`'s documents under `config.embedding.corpus`; the training file must hold at
    least one batch (`train.batch_size`) of documents that gave a pair."""
    c = config.embedding.corpus
    mined = mine_pairs(read_documents(path, c.text_key, c.title_key, c.one_doc_per_line), c, path)
    batch = config.train.batch_size
    if path == config.data.train_file:
        documents = len({key.rpartition("#")[0] for key in mined.split.ids})
        if documents < batch:
            raise PipelineError(
                f"{path}: {documents} documents give pairs, fewer than one batch (train.batch_size {batch}): every "
                "pair's in-batch negatives are the other documents' pairs, so a batch needs that many different "
                f"documents; lower train.batch_size to at most {documents} (embedding.cache_mini_batch keeps the "
                "memory small whatever the batch) or give more documents")
    return mined.split
