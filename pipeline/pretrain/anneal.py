"""Annealing from a checkpoint: run only the decay of a schedule, starting at a stable-phase checkpoint.

ModernBERT's decay phase and Ettin's three phases train a long stable phase once, then decay
from one of its checkpoints; a run can so be extended or ended early without a restart. With
`train.anneal_from` (a checkpoint) and `train.anneal_steps` (N), the run loads the checkpoint's
weights, optimizer moments and step S, continues the data stream at step S (the order is a pure
function of the step and the global batch, batches.py, so the next batches are those the stable
run would have drawn), and trains steps S … S + N − 1 into its own `train.output_dir`.

The LR over those steps, as a fraction of `optimizer.lr`:

    m(S + k) = floor + (m_S − floor) · shape(k / N),   k = 0 … N − 1

where m_S is the LR the stable run's own schedule gives step S (read from the config recorded in
the checkpoint: a stable phase at constant LR gives its peak, whatever this config's schedule),
floor is this config's `schedule.end_lr_ratio`, and shape is its `schedule.decay`: linear 1 − p,
polynomial (1 − p)^power, cosine (1 + cos πp)/2, 1-sqrt 1 − √p.
The anneal run checkpoints like any run and resumes from its own checkpoints exactly; the source
checkpoint is only read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.common.errors import PipelineError
from pipeline.pretrain import checkpoints
from pipeline.pretrain.config import PretrainConfig

if TYPE_CHECKING:
    from pipeline.pretrain.phases import Phase

# The decay shapes of p ∈ [0, 1): 1 at the start, towards 0 at the end. "cosine" and "1-sqrt" are
# WSD's (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
# Durations"); they apply once the schedule section offers them.
DECAY_SHAPES = {
    "linear": lambda p, power: 1.0 - p,
    "polynomial": lambda p, power: (1.0 - p) ** power,
    "cosine": lambda p, power: 0.5 * (1.0 + math.cos(math.pi * p)),
    "1-sqrt": lambda p, power: 1.0 - math.sqrt(p),
}


@dataclass(frozen=True)
class Anneal:
    """The resolved decay: the checkpoint it starts from, its step, its length and its LR ends."""

    checkpoint: Path
    start: int
    """The checkpoint's step: the first annealed step is this (0-based)."""
    steps: int
    start_multiplier: float
    """The LR at `start` as a fraction of optimizer.lr."""
    floor: float
    decay: str
    power: float

    @property
    def end(self) -> int:
        """One past the last annealed step: the run's end."""
        return self.start + self.steps

    def multiplier(self, step: int) -> float:
        """LR at optimizer step `step` (0-based) as a fraction of optimizer.lr (the module's formula)."""
        p = min(max(step - self.start, 0), self.steps) / self.steps
        return self.floor + (self.start_multiplier - self.floor) * DECAY_SHAPES[self.decay](p, self.power)


def source_checkpoint(config: PretrainConfig) -> Path:
    """The checkpoint `train.anneal_from` names (a run folder: its newest complete one)."""
    return checkpoints.resolve_checkpoint(config.train.anneal_from)


def stable_multiplier(config: PretrainConfig, phases: list[Phase], marker: dict, step: int) -> float:
    """The LR the checkpoint's own run gave optimizer step `step`, as a fraction of `config`'s optimizer.lr.

    From the config the checkpoint recorded (its own phases, resolved here: another run's config); a checkpoint
    without one is taken to share `config`'s schedule and `phases`.
    """
    from pipeline.common.config_tree import build_config
    from pipeline.pretrain.engine import phase_lr_multiplier
    from pipeline.pretrain.phases import resolve_phases

    stable, stable_phases = config, phases
    if isinstance(marker.get("config"), dict):
        stable, problems = build_config(PretrainConfig, marker["config"])
        if problems:
            raise PipelineError(f"train.anneal_from: the config recorded in the checkpoint does not load: "
                                f"{'; '.join(problems)}")
        stable_phases = resolve_phases(stable)
    lr = stable.optimizer.lr
    return phase_lr_multiplier(step, stable_phases, stable.schedule, lr) * lr / config.optimizer.lr


def resolve_anneal(config: PretrainConfig, phases: list[Phase]) -> Anneal | None:
    """The run's decay, or None without `train.anneal_from`; `phases` are `config`'s (`resolve_phases`)."""
    t = config.train
    if not t.anneal_from:
        return None
    checkpoint = source_checkpoint(config)
    marker = checkpoints.read_marker(checkpoint)
    start = int(marker["step"])
    s = config.schedule
    return Anneal(checkpoint, start, int(t.anneal_steps), stable_multiplier(config, phases, marker, start),
                  s.end_lr_ratio, s.decay, s.power)
