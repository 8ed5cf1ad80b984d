"""What differs between task families, behind one small object; the fine-tuning loop knows none of it.

A family says which HF model class to build (with the task's label names), how to encode a
split, how a batch's output becomes predictions, which metrics those give, and which files to
write about them. The families are sub-packages beside this module: sentence and sentence-pair
tasks (`sequence/`), token tagging (`token/`), extractive QA (`qa/`) and embeddings (`embedding/`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipeline.common.run_layout import SeedLayout
from pipeline.data.tasks.catalog import TaskSpec
from pipeline.data.tasks.splits import Split
from pipeline.finetune.families.metrics import task_metrics


class TaskFamily:
    """The per-family parts of fine-tuning; see `sequence.family.SequenceTask` for a complete one."""

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
