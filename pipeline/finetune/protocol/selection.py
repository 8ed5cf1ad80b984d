"""The selection slice: a fixed share of the TRAINING split, held out to choose a fine-tuning setting.

Membership is a hash of each example's content (its texts, words, or question and context), not
its position or a random draw, so the slice is the same on every run, every process and every
arm, and does not move when examples are added to or removed from the file. Dev is never part of
it: settings are chosen without looking at the split the results are reported on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.qa_files import QASplit
from pipeline.data.tasks.splits import Split, TaskData
from pipeline.data.tasks.token_files import TaggedSplit
from pipeline.finetune.loop.arm import SELECT


def example_key(split: Split | TaggedSplit | QASplit, i: int) -> str:
    """What identifies example `i` by content, for each task family's split type."""
    if isinstance(split, TaggedSplit):
        return " ".join(split.words[i])
    if isinstance(split, QASplit):
        e = split.examples[i]
        return f"{e.question}\x1f{e.context}"
    return "\x1f".join(split.texts[i])


def select_score(key: str) -> float:
    """A number in [0, 1) fixed by the example's content; examples under the fraction form the slice.

    The same rule (blake2b, 8 bytes) as the shard stage's validation split, but salted, so that the
    slice is not correlated with which documents pretraining held out.
    """
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8, person=b"ft-select").digest()
    return int.from_bytes(digest, "big") / 2**64


def subset(split: Split | TaggedSplit | QASplit, indices: list[int], source: str):
    """The examples at `indices`, as a split of the same type named `source`."""
    if isinstance(split, TaggedSplit):
        return TaggedSplit(source, [split.words[i] for i in indices], [split.tags[i] for i in indices],
                           [split.lines[i] for i in indices])
    if isinstance(split, QASplit):
        return QASplit(source, [split.examples[i] for i in indices], [split.where[i] for i in indices])
    labels = [split.labels[i] for i in indices] if split.labels is not None else None
    return Split(source, [split.texts[i] for i in indices], labels, [split.ids[i] for i in indices])


@dataclass
class SelectionSplit:
    """The training split cut in two: `fit` (trained on) and `held_out` (the slice that scores settings)."""

    fit: Split | TaggedSplit | QASplit
    held_out: Split | TaggedSplit | QASplit
    fraction: float

    def record(self) -> dict:
        """What identifies the slice in completion records and metrics.json."""
        return {"fraction": self.fraction, "held_out": len(self.held_out), "fit": len(self.fit)}


def split_for_selection(train: Split | TaggedSplit | QASplit, fraction: float) -> SelectionSplit:
    """Cut `train` by content hash: examples scoring under `fraction` are held out."""
    if not 0 < fraction < 1:
        raise PipelineError(f"--select-fraction: must be between 0 and 1 (exclusive), got {fraction}")
    held = [select_score(example_key(train, i)) < fraction for i in range(len(train))]
    fit_ids = [i for i, h in enumerate(held) if not h]
    held_ids = [i for i, h in enumerate(held) if h]
    if not fit_ids or not held_ids:
        raise PipelineError(f"{train.source}: --select-fraction {fraction} leaves {len(held_ids)} of {len(train)} "
                            "training examples for selection and the rest for training; each needs at least one "
                            "(use more training examples or another fraction)")
    return SelectionSplit(subset(train, fit_ids, f"{train.source} (without the selection slice)"),
                          subset(train, held_ids, f"{train.source} (selection slice)"), fraction)


def selection_task(data: TaskData, cut: SelectionSplit) -> TaskData:
    """The task the settings are scored on: trained on `cut.fit`, validated on the slice; no dev, no test."""
    return TaskData(data.spec, cut.fit, {SELECT: cut.held_out}, {})
