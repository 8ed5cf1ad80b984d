"""The learning rate: the one owner of it, a closed form of the optimizer step over the run's segments.

The LR at optimizer step n (0-based), as a multiple of `optimizer.lr`, is the value at n of the
segment that holds n. Each phase (phases.py; a run without phases is one phase) gives its own:

- warmup: linear, (n − start + 1) / (warmup + 1) of the phase's peak, so that no step is spent at
  LR 0 (DeepSpeed's WarmupDecayLR spends two there);
- `kind: warmup-decay`: one decay over all the steps after the warmup: `linear` 1 − p,
  `polynomial` (1 − p)^power, `cosine` (1 + cos πp)/2, or `constant` (the peak throughout);
- `kind: wsd` (warmup–stable–decay, the "trapezoidal" schedule of ModernBERT, Ettin and mmBERT):
  the peak held, then a decay over the phase's last `decay_steps` (or `decay_fraction` of its steps):
  `linear`, `cosine` or `1-sqrt` 1 − √p (ModernBERT's `OneMinusSqrtScheduler`); `decay_steps: 0`
  holds the peak to the phase's end.

A decay runs from `high` to `low` as low + (high − low) · shape(p), p = (n − start) / (end − start):
from the phase's peak to `schedule.end_lr_ratio` of it, which it reaches at the phase's end. The
closed forms are written here rather than borrowed from transformers' `get_*_schedule` because those
exist only as LambdaLR objects over an optimizer; tests/pretrain/test_schedules.py checks them
against transformers' own functions.

An anneal is one more segment. The engine's scheduler is a LambdaLR over
`Schedule.multiplier` (engine.py); a resume restores the scheduler's step, and the LR follows from it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # nothing at run time: the preflight's checks import this module
    import torch

    from pipeline.pretrain.config import PretrainConfig, ScheduleConfig
    from pipeline.pretrain.plan.phases import Phase

# The decay shapes of p ∈ [0, 1]: 1 at p = 0, 0 at p = 1. "cosine" and "1-sqrt" are WSD's (Hägele et al.
# 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations").
DECAYS: dict[str, Callable[[float, float], float]] = {
    "linear": lambda p, power: 1.0 - p,
    "polynomial": lambda p, power: (1.0 - p) ** power,
    "cosine": lambda p, power: 0.5 * (1.0 + math.cos(math.pi * p)),
    "1-sqrt": lambda p, power: 1.0 - math.sqrt(p),
}


@dataclass(frozen=True, kw_only=True)
class Segment:
    """Optimizer steps [start, end) whose LR follows one piece of the schedule, as a multiple of optimizer.lr."""

    start: int
    end: int
    shape: Literal["warmup", "constant", "linear", "polynomial", "cosine", "1-sqrt"]
    high: float
    """The peak: what a warmup rises to, a constant holds, a decay starts from."""
    low: float = 0.0
    """A decay's level at `end`."""
    power: float = 1.0
    """The polynomial decay's exponent."""

    def at(self, step: int) -> float:
        if self.shape == "warmup":
            return self.high * (step - self.start + 1) / (self.end - self.start + 1)
        if self.shape == "constant":
            return self.high
        p = (step - self.start) / (self.end - self.start)
        return self.low + (self.high - self.low) * DECAYS[self.shape](p, self.power)


@dataclass(frozen=True)
class Anneal:
    """Only the decay, from a stable-phase checkpoint (`train.anneal_from`): its step, length and source run.

    ModernBERT's decay phase and Ettin's three phases train a long stable phase once, then decay from one
    of its checkpoints; the LR falls from what the source run's schedule gave its step.
    """

    start: int
    steps: int
    source: PretrainConfig
    """The config of the run that wrote the checkpoint (recorded in it)."""


@dataclass(frozen=True)
class Schedule:
    """A run's LR: its segments, in order, each starting where the previous one ends."""

    segments: tuple[Segment, ...]

    def multiplier(self, step: int) -> float:
        """LR at optimizer step `step` (0-based) as a multiple of optimizer.lr; past the end, the end's value."""
        for segment in self.segments:
            if step < segment.end:
                return segment.at(max(step, segment.start))
        last = self.segments[-1]
        return last.at(last.end)


def wsd_decay_steps(schedule: ScheduleConfig, steps: int) -> int:
    """The WSD decay's length in a run (or phase) of `steps`: `decay_steps`, else ⌊decay_fraction × steps⌋."""
    if schedule.decay_steps is not None:
        return schedule.decay_steps
    return math.floor((schedule.decay_fraction or 0.0) * steps)


def segments(schedule: ScheduleConfig, *, start: int, end: int, warmup: int, peak: float = 1.0,
             decay_steps: int | None = None) -> tuple[Segment, ...]:
    """One phase's warmup, stable part and decay over steps [start, end), at `peak` (a multiple of optimizer.lr).

    `decay_steps` (WSD) replaces the schedule's own decay length, as a phase may (phases.py).
    """
    s, after = schedule, start + warmup  # the warmup's end
    parts = [Segment(start=start, end=after, shape="warmup", high=peak)]
    if s.kind == "wsd":
        decay = wsd_decay_steps(s, end - start) if decay_steps is None else decay_steps
        stable_end = max(after, end - decay) if decay else end
        parts.append(Segment(start=after, end=stable_end, shape="constant", high=peak))
        if decay:
            parts.append(Segment(start=stable_end, end=stable_end + decay, shape=s.decay, high=peak,
                                 low=peak * s.end_lr_ratio))
    elif s.decay == "constant":
        parts.append(Segment(start=after, end=end, shape="constant", high=peak))
    else:
        parts.append(Segment(start=after, end=after + max(1, end - after), shape=s.decay, high=peak,
                             low=peak * s.end_lr_ratio, power=s.power))
    # A phase that is all warmup has no decay inside it; a 1-step decay there would start past its end.
    return tuple(part for part in parts if part.start < part.end and part.start < end)


def lr_schedule(config: PretrainConfig, phases: list[Phase], anneal: Anneal | None = None) -> Schedule:
    """The run's schedule: its `phases`' segments (`resolve_phases(config)`), or with an anneal its decay, from the
    LR the source run's own schedule gave its step to `schedule.end_lr_ratio`."""
    if anneal is None:
        return Schedule(tuple(part for p in phases for part in segments(
            config.schedule, start=p.start, end=p.end, warmup=p.warmup_steps, peak=p.lr / config.optimizer.lr,
            decay_steps=p.decay_steps)))
    from pipeline.pretrain.plan.phases import resolve_phases

    source = lr_schedule(anneal.source, resolve_phases(anneal.source))
    start = source.multiplier(anneal.start) * anneal.source.optimizer.lr / config.optimizer.lr
    s = config.schedule
    return Schedule((Segment(start=anneal.start, end=anneal.start + anneal.steps, shape=s.decay, high=start,
                             low=s.end_lr_ratio, power=s.power),))


def lr_scheduler(optimizer: torch.optim.Optimizer, schedule: Schedule) -> torch.optim.lr_scheduler.LambdaLR:
    """Each group's base LR × `schedule.multiplier(step)` (schedules.py, the one owner of the LR)."""
    # A function, not the Schedule object: LambdaLR saves a callable object's __dict__ in its state and puts it back
    # on load, which would replace this run's segments with the checkpoint's (an anneal's source, say).
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, lambda step: schedule.multiplier(step))


def restore_step(scheduler: torch.optim.lr_scheduler.LambdaLR, step: int) -> None:
    """Put a loaded scheduler at optimizer step `step`; its LambdaLR sets each group's LR from the run's schedule.

    A resume restores the step, not the LR the checkpoint's optimizer saved: the two differ for an anneal (the
    source run's schedule saved it) and for a resume with another train.max_steps.
    """
    scheduler.last_epoch = step - 1
    with warnings.catch_warnings():  # torch warns of a step before optimizer.step(): this restores one, takes none
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        scheduler.step()
