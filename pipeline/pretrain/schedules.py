"""The LR schedule's shape: a multiplier of the peak LR at each optimizer step of a run (or of one phase).

Every schedule starts with the pipeline's linear warmup, which begins at 1/(warmup+1) of the peak
rather than 0 so that no step is spent at LR 0 (DeepSpeed's WarmupDecayLR spends two there). After it:

- `kind: warmup-decay` decays over all the remaining steps: `linear`, `polynomial` (exponent
  `power`), `cosine` (a half cosine), or `constant`;
- `kind: wsd` (warmup–stable–decay, the "trapezoidal" schedule of ModernBERT, Ettin and mmBERT)
  holds the peak, then decays over the last `decay_steps` (or `decay_fraction` of the steps):
  `linear`, `cosine` or `1-sqrt`. ModernBERT's 1-sqrt decay (its `OneMinusSqrtScheduler`) is
  f(n) = α + (1 − α)(1 − √((n − (N − D)) / D)) with α = `end_lr_ratio`.

Both decays end at `end_lr_ratio` of the peak at step N (one past the last step). The cosine and
WSD shapes after the warmup are transformers' own (`get_cosine_with_min_lr_schedule_with_warmup`,
`get_wsd_schedule`) evaluated from the warmup's end; tests/pretrain/test_schedules.py checks them
against the closed forms.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from pipeline.pretrain.config import ScheduleConfig


def warmup_multiplier(step: int, warmup_steps: int) -> float:
    """Linear warmup: (step + 1) / (warmup + 1), so the first step already learns."""
    return (step + 1) / (warmup_steps + 1)


@functools.lru_cache(maxsize=64)
def _transformers_lambda(factory_name: str, **kwargs) -> Callable[[int], float]:
    """transformers' schedule function `factory_name` as a step → multiplier function.

    transformers exposes its schedules only as LambdaLR objects over an optimizer; the function is the
    LambdaLR's `lr_lambdas[0]`, taken here from one built over a throwaway parameter.
    """
    import transformers.optimization as schedules

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    return getattr(schedules, factory_name)(optimizer, **kwargs).lr_lambdas[0]


def wsd_decay_steps(schedule: ScheduleConfig, steps: int) -> int:
    """The WSD decay's length in a run (or phase) of `steps`: `decay_steps`, else ⌊decay_fraction × steps⌋."""
    if schedule.decay_steps is not None:
        return schedule.decay_steps
    return math.floor((schedule.decay_fraction or 0.0) * steps)


def lr_multiplier(step: int, schedule: ScheduleConfig, max_steps: int, decay_steps: int | None = None) -> float:
    """LR at optimizer step `step` (0-based) of `max_steps` as a fraction of the peak.

    `decay_steps` (WSD only) overrides the schedule's own, as a phase may (phases.py).
    """
    warmup = schedule.warmup_steps
    if step < warmup:
        return warmup_multiplier(step, warmup)
    after, length = step - warmup, max(1, max_steps - warmup)  # steps since the warmup, and how many follow it
    if schedule.kind == "wsd":
        decay = wsd_decay_steps(schedule, max_steps) if decay_steps is None else decay_steps
        if decay == 0:  # a stable phase: the decay comes in a later one
            return 1.0
        return _transformers_lambda("get_wsd_schedule", num_warmup_steps=0, num_decay_steps=decay,
                                    num_stable_steps=max(0, max_steps - warmup - decay), decay_type=schedule.decay,
                                    min_lr_ratio=schedule.end_lr_ratio)(after)
    if schedule.decay == "constant":
        return 1.0
    if schedule.decay == "cosine":
        return _transformers_lambda("get_cosine_with_min_lr_schedule_with_warmup", num_warmup_steps=0,
                                    num_training_steps=length, min_lr_rate=schedule.end_lr_ratio)(min(after, length))
    # transformers' polynomial schedule ends at an absolute LR and starts its warmup at 0; this one is short.
    remaining = max(0.0, 1.0 - after / length)
    power = 1.0 if schedule.decay == "linear" else schedule.power
    return schedule.end_lr_ratio + (1.0 - schedule.end_lr_ratio) * remaining**power
