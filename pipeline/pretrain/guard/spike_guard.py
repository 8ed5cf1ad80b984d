"""The spike guard's judgement: each step's loss and gradient norm judged on the device against the last steps'
(`train.spike_guard`). What the run does about an outlier is spike_response.py's.

A step is an outlier when its loss or its gradient norm lies more than `guard.threshold` deviations above the mean
of the last `guard.window` steps (once `guard.min_steps` are held: OLMo-core's skip-step optimizer), or when either
is not finite. An outlier enters the window clipped to that bar, so a spike does not lift the bar for the next one,
while a lasting change of level is followed. The window re-arms (starts empty, and judges again after
`guard.min_steps`) whenever what it measures changes: a new phase, however the run arrives there (a hand-over, a
resume or a rollback onto a phase boundary), or a resume whose mix, batch, optimizer, schedule, masking or model
differs from the run that filled the window (`level_of`). The loss is every rank's mean (one scalar all-reduce a
step, on the device) and the norm DeepSpeed's global one, so every rank judges alike.

Nothing is read back between logging steps: the verdict, the window and the outliers found stay in device tensors,
and `readout` joins them to the losses' one all-reduce and copy at a check (step/step_sync.py), where `verdict` turns
them into a `Spike` for spike_response.py. A step is judged between its gradient norm and its update:
- at ZeRO 0 in its clipping (step/deepspeed_patches.py), which hands the verdict to the optimizer as `found_inf`
  (torch's fused AdamW, LAMB, StableAdamW): the whole update is left out, weights, moments and step counter alike.
  `skip` and `rollback` alike leave every outlier's update out (`rollback` goes back after `guard.rollback_after`
  of them);
- at ZeRO 1-3 after DeepSpeed's step, on its norm: `rollback` only (config.py refuses `skip` there), which goes back
  at the first outlier, whose update is already in the weights (spike_response.py).
The window goes back with a checkpoint, which holds it (`state_dict`), so a resumed run judges as an uninterrupted
one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from pipeline.common.config.tree import to_dict
from pipeline.pretrain.config import PretrainConfig, spike_drill
from pipeline.pretrain.plan.run_plan import Stretch

MIN_DEVIATION = 1e-3
"""The least deviation, as a share of the window's mean: a flat window must not call every rise an outlier."""
NONE = -1
"""No step (a slot of the outlier ring that names none)."""
LEVEL_SECTIONS = ("model", "masking", "optimizer", "schedule")
"""The config's sections that set the level of the loss and the gradient norm (with the stretch's phase, corpora,
shares and batch, and the training precision)."""


@dataclass(frozen=True)
class Drill:
    """`train.inject_spike`: step `step`'s loss, and so its gradients, multiplied by `factor` before the backward."""

    step: int | None = None
    factor: float = 1.0

    @classmethod
    def of(cls, text: str | None) -> Drill:
        return cls() if text is None else cls(*spike_drill(text))

    def scaled(self, loss: torch.Tensor, step: int) -> torch.Tensor:
        """The loss to backpropagate at step `step` (1-based)."""
        return loss * self.factor if step == self.step else loss


@dataclass(frozen=True)
class Spike:
    """What a check found (steps 1-based): the outliers since the last check and among the last `window` steps."""

    count: int
    """Outliers since the last check."""
    nonfinite: int
    """Of them, steps whose loss or gradient norm was not finite."""
    since: tuple[int, ...]
    """The outliers since the last check that the window still names (all of them unless checks are further apart)."""
    window: tuple[int, ...]
    """The outliers among the last `guard.window` steps."""
    first: int | None
    last: int | None
    """The first and last outlier known: since the last check, or in the window."""


def level_of(stretch: Stretch, config: PretrainConfig) -> str:
    """What the window measures the level of: the stretch's phase, corpora and shares, and the config's sections that
    move a loss or a norm (`LEVEL_SECTIONS`, the global batch, the precision). Not the stretch's own batch: a batch
    warmup's hand-overs keep their window."""
    what = {"phase": stretch.phase.index, "corpora": stretch.keys, "shares": [str(s) for s in stretch.shares],
            "batch": config.train.global_batch_size, "precision": config.train.precision,
            **{name: to_dict(getattr(config, name)) for name in LEVEL_SECTIONS}}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


class SpikeGuard:
    """One rank's guard: the window and the outliers found in device tensors, judged every step, read at checks."""

    def __init__(self, config: PretrainConfig, device: torch.device | str, world_size: int):
        t, g = config.train, config.guard
        self.mode, self.world_size = t.spike_guard, world_size
        self.window, self.threshold, self.min_steps = g.window, g.threshold, g.min_steps
        self.judges_in_step = t.zero_stage == 0
        # An fp16 overflow is its loss scaler's to skip (and halve the scale for): not a spike.
        self.nonfinite_is_outlier = t.precision != "fp16"
        self.history = torch.zeros(2, g.window, device=device)
        """The last steps' loss (row 0) and gradient norm (row 1), a ring written at `slot`."""
        self.filled = torch.zeros((), dtype=torch.long, device=device)
        self.slot = torch.zeros((), dtype=torch.long, device=device)
        self.outliers = torch.full((g.window,), NONE, dtype=torch.long, device=device)
        """Step n's slot (n % window) holds n if it was an outlier, else NONE."""
        self._fresh = torch.tensor([0, 0, NONE, NONE], dtype=torch.long, device=device)
        self.since = self._fresh.clone()
        """Since the last check: outliers, non-finite ones, the first and the last."""
        self.skip = torch.zeros((), device=device)
        """The verdict on the step being taken: 1 leaves its update out (torch's `found_inf`), for every outlier."""
        self.can_skip = False
        """Whether the step can leave an update out (step/deepspeed_patches.py: ZeRO 0, its optimizer taking
        `found_inf`)."""
        self.level: str | None = None
        self._slots = torch.arange(g.window, device=device)
        self._step, self._loss, self._last_check = 0, None, 0

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def loss(self, step: int, micro_losses: list[torch.Tensor]) -> None:
        """Step `step`'s (1-based) micro-batch losses on this rank, before its update; the guard judges the mean over
        them and every rank (nothing is computed with the guard off: this is the step's hot path)."""
        if not self.on:
            return
        loss = torch.stack(micro_losses).mean()
        if self.world_size > 1:
            dist.all_reduce(loss)
            loss = loss / self.world_size
        self._step, self._loss = step, loss.float().reshape(())

    def judge(self, grad_norm: torch.Tensor | float | None) -> None:
        """Judge the step whose loss `loss` gave, with its gradient norm (None: DeepSpeed kept none, the loss alone)."""
        if not self.on:
            return
        device = self.skip.device
        norm = torch.as_tensor(0.0 if grad_norm is None else grad_norm, dtype=torch.float32, device=device).reshape(())
        x = torch.stack([self._loss, norm])
        n = self.filled
        held = self._slots < n
        mean = torch.where(held, self.history, 0).sum(1) / n.clamp(min=1)
        var = torch.where(held, (self.history - mean[:, None]) ** 2, 0).sum(1) / (n - 1).clamp(min=1)
        bar = mean + self.threshold * torch.maximum(var.sqrt(), MIN_DEVIATION * mean.abs())
        judged = n >= self.min_steps
        finite = torch.isfinite(x).all() & (norm >= 0)  # DeepSpeed marks a norm it found invalid with -1
        outlier = finite & judged & (x > bar).any()
        if self.nonfinite_is_outlier:
            outlier = outlier | ~finite
        self.skip.copy_(outlier)
        kept = torch.where(judged, torch.minimum(x, bar), x)  # an outlier enters at the bar
        written = (self._slots == self.slot) & finite
        self.history.copy_(torch.where(written, kept[:, None], self.history))
        self.slot.copy_((self.slot + finite) % self.window)
        self.filled.copy_((self.filled + finite).clamp(max=self.window))
        step = self._step
        self.outliers[step % self.window] = torch.where(outlier, step, NONE)
        count, nonfinite, first, last = self.since.unbind()
        self.since.copy_(torch.stack([count + outlier, nonfinite + (outlier & ~finite),
                                      torch.where(outlier & (first == NONE), step, first),
                                      torch.where(outlier, step, last)]))

    def after_update(self, engine) -> None:
        """At ZeRO 1-3: judge the step DeepSpeed has just taken, on its gradient norm (ZeRO 0 judged it inside)."""
        if self.on and not self.judges_in_step:
            self.judge(engine.get_global_grad_norm())

    def enter(self, level: str) -> bool:
        """The run trains at `level` (`level_of`) from now on: a window of another level (or of none known, as a
        checkpoint from before levels were kept holds) starts empty. Whether a window of a known level was dropped."""
        dropped = self.on and self.level is not None and level != self.level
        if level != self.level:
            self.reset_window()
        self.level = level
        return dropped

    def reset_window(self) -> None:
        self.filled.zero_()
        self.slot.zero_()

    def forget(self, steps: tuple[int, ...]) -> None:
        """Outliers dealt with without a rollback (no checkpoint lay behind them): they no longer count towards one,
        nor does the first of them anchor it (a host write, no read)."""
        if steps:
            self.outliers[torch.tensor([s % self.window for s in steps], device=self.outliers.device)] = NONE

    def readout(self) -> torch.Tensor | None:
        """What a check brings to the host with the losses (the same on every rank); starts a new count."""
        if not self.on:
            return None
        values = torch.cat([self.since, self.outliers]).double()
        self.since.copy_(self._fresh)
        return values

    def verdict(self, values: list[float], step: int) -> Spike | None:
        """`readout`'s values, on the host after `step` steps."""
        if not self.on:
            return None
        count, nonfinite, first, last = (int(round(v)) for v in values[:4])
        window = tuple(sorted(s for s in (int(round(v)) for v in values[4:]) if s > max(step - self.window, 0)))
        since = tuple(s for s in window if s > self._last_check)
        self._last_check = step
        known = [s for s in (*window, first, last) if s != NONE and s > 0]
        return Spike(count, nonfinite, since, window, min(known, default=None), max(known, default=None))

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds (nothing with the guard off): the window, the outlier ring and their level."""
        if not self.on:
            return {}
        return {"history": self.history, "filled": self.filled, "slot": self.slot, "outliers": self.outliers,
                "level": self.level}

    def load_state_dict(self, state: dict[str, Any] | None, step: int) -> None:
        """The window a checkpoint after `step` steps held; none (the guard was off, or its window had another length):
        an empty one, as at a run's start."""
        self._last_check = step
        if not state or state["history"].shape != self.history.shape:
            self.reset_window()
            self.outliers.fill_(NONE)
            self.level = None
            return
        for name in ("history", "filled", "slot", "outliers"):
            getattr(self, name).copy_(state[name])
        self.level = state.get("level")
