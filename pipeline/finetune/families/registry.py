"""Which task family handles a task: sentence classification, token tagging, extractive QA or embeddings."""

from __future__ import annotations

from pipeline.data.tasks.catalog import QA_TASKS, TOKEN_TASKS
from pipeline.data.tasks.splits import TaskData
from pipeline.finetune.families.embedding.config import EMBEDDING_TASKS
from pipeline.finetune.families.embedding.family import EmbeddingFamily
from pipeline.finetune.families.interface import TaskFamily
from pipeline.finetune.families.qa.family import QuestionAnsweringFamily
from pipeline.finetune.families.sequence.family import SequenceTask
from pipeline.finetune.families.token.family import TokenTaggingFamily


def task_family(data: TaskData, options=None) -> TaskFamily:
    """The family that handles `data`'s task; `options` is the config's data section (token and QA settings)."""
    if data.spec.name in TOKEN_TASKS:
        return TokenTaggingFamily(data, options)
    if data.spec.name in EMBEDDING_TASKS:
        return EmbeddingFamily(data, options)
    if data.spec.name in QA_TASKS:
        return QuestionAnsweringFamily(data, options)
    return SequenceTask(data.spec)
