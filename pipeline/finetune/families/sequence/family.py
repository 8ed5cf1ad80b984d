"""Sentence and sentence-pair tasks (GLUE, custom tables) as a task family: one class or one score per example."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipeline.common.atomic_files import write_text_atomic
from pipeline.common.run_layout import SeedLayout
from pipeline.data.tasks.catalog import TaskSpec
from pipeline.data.tasks.splits import Split
from pipeline.finetune.families.interface import TaskFamily, load_head_model


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
        from pipeline.finetune.families.sequence.confusion_figure import draw_confusion

        n = self.spec.num_labels  # every class, in the task's order, whether or not dev has it
        counts = np.bincount(np.asarray(labels, dtype=np.int64) * n + np.asarray(predictions, dtype=np.int64),
                             minlength=n * n).reshape(n, n)
        return draw_confusion(path, counts, self.spec.class_names,
                              f"{self.spec.name} dev{'' if split == 'dev' else ' ' + split}")
