"""Every task fine-tuning knows, in one place: the GLUE tasks' files, columns, labels and official metrics,
and the token-tagging and QA tasks (any other `task` is `custom`).

Columns are named as in the real GLUE data folder's TSV headers; CoLA's train and dev files have
no header, so its columns are given by position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TagFormat = Literal["conll", "conllu", "jsonl"]


@dataclass(frozen=True)
class TaskSpec:
    name: str
    text_columns: tuple[str, ...]
    label_column: str | None
    labels: tuple[str, ...] | None
    """Label strings as they appear in the files, in class-id order; None for regression."""
    metrics: tuple[str, ...]
    """Official metrics; the first is the one that picks the best epoch."""
    dev_files: tuple[str, ...] = ("dev.tsv",)
    test_files: tuple[str, ...] = ("test.tsv",)
    headerless_columns: tuple[str, ...] | None = None
    """Column names for train/dev files that have no header row (CoLA)."""
    hf_text_columns: tuple[str, ...] | None = None
    """Text columns in the `datasets` version ("glue", task), when they differ from the TSV's."""
    label_names: tuple[str, ...] | None = None
    """What each class means, in class-id order, when the files say `0`/`1` (datasets' GLUE names)."""

    @property
    def class_names(self) -> tuple[str, ...] | None:
        """The names a saved model's `id2label` and the dev prediction files use."""
        return self.label_names or self.labels

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)


GLUE_TASKS: dict[str, TaskSpec] = {t.name: t for t in (
    TaskSpec("cola", ("sentence",), "label", ("0", "1"), ("matthews_correlation",),
             headerless_columns=("source", "label", "original_label", "sentence"),
             label_names=("unacceptable", "acceptable")),
    TaskSpec("sst2", ("sentence",), "label", ("0", "1"), ("accuracy",), label_names=("negative", "positive")),
    TaskSpec("mrpc", ("#1 String", "#2 String"), "Quality", ("0", "1"), ("f1", "accuracy"),
             hf_text_columns=("sentence1", "sentence2"), label_names=("not_equivalent", "equivalent")),
    TaskSpec("qqp", ("question1", "question2"), "is_duplicate", ("0", "1"), ("f1", "accuracy"),
             label_names=("not_duplicate", "duplicate")),
    TaskSpec("stsb", ("sentence1", "sentence2"), "score", None, ("pearson", "spearman")),
    TaskSpec("mnli", ("sentence1", "sentence2"), "gold_label", ("contradiction", "entailment", "neutral"),
             ("accuracy_matched", "accuracy_mismatched"), dev_files=("dev_matched.tsv", "dev_mismatched.tsv"),
             test_files=("test_matched.tsv", "test_mismatched.tsv"), hf_text_columns=("premise", "hypothesis")),
    TaskSpec("qnli", ("question", "sentence"), "label", ("entailment", "not_entailment"), ("accuracy",)),
    TaskSpec("rte", ("sentence1", "sentence2"), "label", ("entailment", "not_entailment"), ("accuracy",)),
    TaskSpec("wnli", ("sentence1", "sentence2"), "label", ("0", "1"), ("accuracy",),
             label_names=("not_entailment", "entailment")),
)}

# The folder names of the GLUE data layout.
GLUE_FOLDERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B", "mnli": "MNLI",
                "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli"}




@dataclass(frozen=True)
class TokenTask:
    name: str
    format: TagFormat | None
    """The files' format; None: from each file's name (`.conllu`, `.jsonl`, else CoNLL)."""
    entity_level: bool | None
    """Score entities with seqeval (NER); False: word accuracy (POS); None: entities when the tags are IOB."""


TOKEN_TASKS = {t.name: t for t in (TokenTask("ner", "conll", True), TokenTask("pos", "conllu", False),
                                   TokenTask("token-custom", None, None))}
QA_TASKS = ("squad", "qa-custom")
SPAN_TASKS = (*TOKEN_TASKS, *QA_TASKS)
"""Token tagging and extractive QA tasks: read from data.train_file / validation_file / test_file."""


def task_spec(name: str) -> TaskSpec:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in GLUE_TASKS:
        from pipeline.common.errors import PipelineError

        raise PipelineError(f"task {name!r}: expected a GLUE task ({', '.join(GLUE_TASKS)}) or 'custom'")
    return GLUE_TASKS[key]
