"""Annealing from a checkpoint: run only the decay of a schedule, starting at a stable-phase checkpoint.

ModernBERT's decay phase and Ettin's three phases train a long stable phase once, then decay from
one of its checkpoints, so a run can be extended or ended early without a restart. With
`train.anneal_from` (a checkpoint) and `train.anneal_steps` (N), the run loads the checkpoint's
weights, optimizer moments and step S, continues the data stream at step S (the order is a pure
function of the step and the global batch), and trains steps S … S + N − 1 into its own
`train.output_dir`, checkpointing and resuming like any run; the source checkpoint is only read.

The LR over those steps is one more segment of schedules.py's closed form: a decay of `schedule.decay`
to `schedule.end_lr_ratio`, from the LR the stable run's own schedule gives step S (built from the
config recorded in the checkpoint: a stable phase at constant LR gives its peak).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.common.config_tree import build_config
from pipeline.common.errors import PipelineError
from pipeline.pretrain import checkpoints
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.phases import Phase, resolve_phases


@dataclass(frozen=True)
class Anneal:
    """The resolved decay: the checkpoint it starts from, its step and length, and the run that wrote it."""

    checkpoint: Path
    start: int
    """The checkpoint's step: the first annealed step is this (0-based)."""
    steps: int
    source: PretrainConfig
    """The config of the run that wrote the checkpoint (recorded in it; without one, this run's)."""
    source_phases: list[Phase]
    """Its phases (`resolve_phases(source)`): with its config they give its LR at `start` (schedules.py)."""

    @property
    def end(self) -> int:
        """One past the last annealed step: the run's end."""
        return self.start + self.steps


def resolve_anneal(config: PretrainConfig) -> Anneal | None:
    """The run's decay, or None without `train.anneal_from`."""
    t = config.train
    if not t.anneal_from:
        return None
    checkpoint = checkpoints.resolve_checkpoint(t.anneal_from)  # a run folder: its newest complete one
    marker = checkpoints.read_marker(checkpoint)
    source = config  # a checkpoint without a recorded config is taken to share this one's
    if isinstance(marker.get("config"), dict):
        source, problems = build_config(PretrainConfig, marker["config"])
        if problems:
            raise PipelineError(f"train.anneal_from: the config recorded in the checkpoint does not load: "
                                f"{'; '.join(problems)}")
    return Anneal(checkpoint, int(marker["step"]), int(t.anneal_steps), source, resolve_phases(source))
