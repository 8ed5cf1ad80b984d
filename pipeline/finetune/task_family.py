"""What differs between task families, behind one small object; the fine-tuning loop knows none of it.

A family says which HF model class to build (with the task's label names), how to encode a
split, how a batch's output becomes predictions, which metrics those give, and which files to
write about them. `SequenceTask` covers sentence and sentence-pair tasks (GLUE): one class or
one score per example. Token classification (`token_family.py`) and extractive QA
(`qa_family.py`) are the other two families.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipeline.common.atomic_files import write_text_atomic
from pipeline.common.run_layout import SeedLayout
from pipeline.finetune.metrics import task_metrics
from pipeline.finetune.task_data import Split
from pipeline.finetune.tasks import TaskSpec


class TaskFamily:
    """The per-family parts of fine-tuning; see `SequenceTask` for a complete one."""

    spec: TaskSpec
    task_type: str
    """Recorded in the saved model's provenance (`classification`, `regression`, …)."""

    @property
    def main_metric(self) -> str:
        """The metric that picks the best epoch and the best seed (higher is better)."""
        return self.spec.metrics[0]

    def build_model(self, source: str, from_scratch: bool) -> torch.nn.Module:
        raise NotImplementedError

    def encode(self, split: Split, tokenizer, max_seq_len: int) -> torch.utils.data.Dataset:
        raise NotImplementedError

    def collator(self, tokenizer):
        raise NotImplementedError

    def predict(self, output, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(predictions, gold labels or None) of one batch, as tensors to gather across processes."""
        raise NotImplementedError

    def metrics(self, predictions: dict[str, np.ndarray], labels: dict[str, np.ndarray]) -> dict[str, float]:
        return task_metrics(self.spec.metrics, predictions, labels)

    def provenance(self) -> dict:
        """What the saved model's `pipeline_finetune.json` records about the task."""
        return {"task": self.spec.name, "task_type": self.task_type, "labels": list(self.spec.class_names or [])}

    def write_dev_reports(self, seed: SeedLayout, splits: dict[str, Split], predictions: dict[str, np.ndarray],
                          labels: dict[str, np.ndarray], figures: bool = True) -> list[Path]:
        """Write the dev reports of a finished seed; return the files written. `figures=False` leaves out the
        drawn ones (a trial or label-curve point: a plot costs more than its training's last epoch)."""
        raise NotImplementedError

    def write_test_predictions(self, seed: SeedLayout, name: str, split: Split, predictions: np.ndarray
                               ) -> list[Path]:
        """Write the predictions on test split `name`; return the files written."""
        raise NotImplementedError


class EncodedSplit(torch.utils.data.Dataset):
    """Tokenized examples (one batch call to the fast tokenizer), padded per batch by the collator."""

    def __init__(self, split: Split, tokenizer, max_len: int, regression: bool):
        pairs = len(split.texts[0]) == 2
        first = [t[0] for t in split.texts]
        second = [t[1] for t in split.texts] if pairs else None
        self.encodings = tokenizer(first, second, truncation=True, max_length=max_len)
        self.labels = split.labels
        self.regression = regression

    def __len__(self) -> int:
        return len(self.encodings["input_ids"])

    def __getitem__(self, i: int) -> dict:
        item = {k: v[i] for k, v in self.encodings.items()}
        if self.labels is not None:
            item["labels"] = float(self.labels[i]) if self.regression else int(self.labels[i])
        return item


class SequenceTask(TaskFamily):
    """One label (classification) or one score (regression) per sentence or sentence pair."""

    def __init__(self, spec: TaskSpec):
        self.spec = spec
        self.task_type = "regression" if spec.is_regression else "classification"

    def build_model(self, source: str, from_scratch: bool) -> torch.nn.Module:
        from transformers import AutoModelForSequenceClassification

        spec = self.spec
        kwargs = {"num_labels": spec.num_labels,
                  "problem_type": "regression" if spec.is_regression else "single_label_classification"}
        if not spec.is_regression:  # the saved model's config then names the task's real classes
            kwargs["id2label"] = dict(enumerate(spec.class_names))
            kwargs["label2id"] = {name: i for i, name in enumerate(spec.class_names)}
        return load_head_model(AutoModelForSequenceClassification, source, from_scratch, **kwargs)

    def encode(self, split: Split, tokenizer, max_seq_len: int) -> torch.utils.data.Dataset:
        return EncodedSplit(split, tokenizer, max_seq_len, self.spec.is_regression)

    def collator(self, tokenizer):
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer)

    def predict(self, output, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = output.logits
        predictions = logits.squeeze(-1).float() if self.spec.is_regression else logits.argmax(-1)
        return predictions, batch.get("labels")

    def show(self, value: float) -> str:
        """A prediction or label as the dev prediction files write it: class name, or the score."""
        return format(float(value), ".9g") if self.spec.is_regression else self.spec.class_names[int(value)]

    def write_dev_reports(self, seed: SeedLayout, splits: dict[str, Split], predictions: dict[str, np.ndarray],
                          labels: dict[str, np.ndarray], figures: bool = True) -> list[Path]:
        """`dev_predictions[_<split>].tsv` (index, prediction, label) and, for classes with `figures`, confusion
        matrices."""
        written = []
        for name, split in splits.items():
            path = seed.dev_predictions(name, len(splits))
            rows = zip(split.ids, predictions[name], labels[name], strict=True)
            write_text_atomic(path, "index\tprediction\tlabel\n"
                              + "".join(f"{i}\t{self.show(p)}\t{self.show(g)}\n" for i, p, g in rows))
            written.append(path)
        if figures and not self.spec.is_regression:
            written += [self._confusion(seed.confusion(name), name, predictions[name], labels[name])
                        for name in predictions]
        return written

    def write_test_predictions(self, seed: SeedLayout, name: str, split: Split, predictions: np.ndarray
                               ) -> list[Path]:
        """The GLUE submission format: `index<TAB>prediction`, labels as in the task's files."""
        shown = ([f"{v:.3f}" for v in predictions] if self.spec.is_regression
                 else [self.spec.labels[int(v)] for v in predictions])
        path = seed.test_predictions(name)
        write_text_atomic(path, "index\tprediction\n"
                          + "".join(f"{i}\t{p}\n" for i, p in zip(split.ids, shown, strict=True)))
        return [path]

    def _confusion(self, path: Path, split: str, predictions: np.ndarray, labels: np.ndarray) -> Path:
        from pipeline.finetune.confusion_figure import draw_confusion

        n = self.spec.num_labels  # every class, in the task's order, whether or not dev has it
        counts = np.bincount(np.asarray(labels, dtype=np.int64) * n + np.asarray(predictions, dtype=np.int64),
                             minlength=n * n).reshape(n, n)
        return draw_confusion(path, counts, self.spec.class_names,
                              f"{self.spec.name} dev{'' if split == 'dev' else ' ' + split}")


def load_head_model(auto_class, source: str, from_scratch: bool, **kwargs) -> torch.nn.Module:
    """`auto_class` from `source` with a new task head; from the config alone (random weights) when `from_scratch`."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    if from_scratch:
        return auto_class.from_config(AutoConfig.from_pretrained(source, **kwargs))
    # transformers prints a table of every newly initialised weight; the task head is always new
    # here, so the trainer says so in one line instead.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return auto_class.from_pretrained(source, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
