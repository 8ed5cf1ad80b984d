"""The spike guard: each step's loss and gradient norm judged on the device against the last steps', and what the
run does about an outlier (`train.spike_guard`): nothing (`off`), leave its update out (`skip`), or go back to the
newest checkpoint before it and leave that stretch's batches out (`rollback`).

A step is an outlier when its loss or its gradient norm lies more than `guard.threshold` deviations above the mean
of the last `guard.window` steps (once `guard.min_steps` are held: OLMo-core's skip-step optimizer), or when either
is not finite. An outlier enters the window clipped to that bar, so a spike does not lift the bar for the next one,
while a lasting change of level is followed; a new phase starts an empty window. The loss is every rank's mean (one
scalar all-reduce a step, on the device) and the norm DeepSpeed's global one, so every rank judges alike.

Nothing is read back between logging steps: the verdict, the window and the outliers found stay in device tensors,
and `readout` joins them to the losses' one all-reduce and copy at a check (cadence.py), where `verdict` turns them
into what the loop does. A step is judged between its gradient norm and its update:
- at ZeRO 0 in its clipping (device_step.py), which hands a `skip` verdict to torch's fused AdamW as `found_inf`:
  the kernel leaves the whole update out, weights, moments and step counter alike;
- at ZeRO 1-3 after DeepSpeed's step, on its norm: `rollback` only (config.py refuses `skip` there).

A rollback goes back to the newest checkpoint before the first outlier, trains again up to it and leaves out the
batches from the first outlier through the last (`guard.margin` more on each side), as `--skip-steps` would: the
run's ledger records it, later checkpoints are set aside, and the same process goes on (`Pretrainer._roll_back`).
The order and dropout are functions of the step, so the steps trained again reach the state the spike met exactly;
what changes is the batches it meets. (Leaving out everything from the checkpoint, as PaLM did by hand, would cost
up to `checkpoint.every` batches a rollback: a margin leaves out as many as wanted.) The window goes back with the
checkpoint, which holds it (`state_dict`), so a resumed run judges as an uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipeline.common.errors import PipelineError
from pipeline.data.tokenizer import TokenizerInfo
from pipeline.pretrain.checkpoints.storage import complete_checkpoints
from pipeline.pretrain.config import PretrainConfig, spike_drill
from pipeline.pretrain.plan.ledger import GaveUpEvent, Ledger, RollbackEvent
from pipeline.pretrain.plan.record import read_record
from pipeline.pretrain.plan.run_plan import RunPlan, build_plan
from pipeline.pretrain.preflight import find_start

MIN_DEVIATION = 1e-3
"""The least deviation, as a share of the window's mean: a flat window must not call every rise an outlier."""
NONE = -1
"""No step (a slot of the outlier ring that names none)."""


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


class GiveUp(PipelineError):
    """The guard stops the run; its event goes in the ledger."""

    def __init__(self, event: GaveUpEvent):
        super().__init__(event.why)
        self.event = event


class SpikeGuard:
    """One rank's guard: the window and the outliers found in device tensors, judged every step, read at checks."""

    def __init__(self, config: PretrainConfig, device: torch.device | str, world_size: int):
        t, g = config.train, config.guard
        self.mode, self.world_size = t.spike_guard, world_size
        self.window, self.threshold, self.min_steps, self.rollback_after = (g.window, g.threshold, g.min_steps,
                                                                            g.rollback_after)
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
        """The verdict on the step being taken: 1 leaves its update out (torch's `found_inf`)."""
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

    def reset_window(self) -> None:
        """A new phase: its loss and norm have their own level, so the window starts empty (and judges again after
        `guard.min_steps`)."""
        self.filled.zero_()
        self.slot.zero_()

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

    def rolls_back(self, spike: Spike) -> bool:
        """rollback: a non-finite loss or norm, or `guard.rollback_after` outliers among the last `window` steps."""
        return self.mode == "rollback" and (spike.nonfinite > 0 or len(spike.window) >= self.rollback_after)

    def stop_if_diverging(self, spike: Spike, at_step: int) -> None:
        """skip: raise GiveUp when more than half the window's updates were left out; the loss has moved, not
        spiked, and leaving out every update would stall the run."""
        if self.mode == "skip" and len(spike.window) > self.window // 2:
            raise gave_up(spike, at_step, (
                f"spike guard: the updates of {len(spike.window)} of the last {self.window} steps were left out "
                f"(steps {spike.window[0]}-{spike.window[-1]}): the loss has moved, not spiked; stopping without "
                f"saving. Lower optimizer.lr or raise schedule.warmup_steps, or use train.spike_guard rollback"))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What a checkpoint holds: the window and the outlier ring."""
        return {"history": self.history, "filled": self.filled, "slot": self.slot, "outliers": self.outliers}

    def load_state_dict(self, state: dict[str, torch.Tensor] | None, step: int) -> None:
        """The window a checkpoint after `step` steps held; none (the guard was off, or its window had another
        length): an empty one, as at a run's start."""
        self._last_check = step
        if state is None or state["history"].shape != self.history.shape:
            self.reset_window()
            self.outliers.fill_(NONE)
            return
        for name, tensor in self.state_dict().items():
            tensor.copy_(state[name])


def gave_up(spike: Spike, at_step: int, why: str) -> GiveUp:
    outliers = spike.window or spike.since
    return GiveUp(GaveUpEvent(outliers, spike.nonfinite, why, at_step))


def rollback_event(plan: RunPlan, spike: Spike, at_step: int) -> RollbackEvent:
    """Where the rollback after `spike`, found after `at_step` steps, goes: the newest of this run's checkpoints before
    its first outlier, and the steps it leaves out, from its first outlier through its last with `guard.margin` more
    on each side (none before the checkpoint). Raises GiveUp when the run has rolled back `guard.max_rollbacks` times,
    or no checkpoint precedes the outlier."""
    g, first, last = plan.config.guard, spike.first, spike.last
    span = f"steps {first}-{last}" if first != last else f"step {first}"
    by_hand = f"--skip-steps {max(first - g.margin, 1)}:{last + g.margin}"
    what = (f"{spike.nonfinite} non-finite loss or gradient norm" if spike.nonfinite else
            f"{len(spike.window)} outlier{'s' * (len(spike.window) != 1)} (loss or gradient norm above the last "
            f"{g.window} steps' mean + {g.threshold:g} deviations)")
    if plan.ledger.rollbacks >= g.max_rollbacks:
        raise gave_up(spike, at_step, (
            f"spike guard: {what} at {span}, after {plan.ledger.rollbacks} rollbacks (guard.max_rollbacks "
            f"{g.max_rollbacks}, counted in {plan.ledger.path}); stopping without saving. Trace the batches "
            f"(roberta-trace {plan.config.train.output_dir} --step {first}), then lower optimizer.lr or raise "
            f"schedule.warmup_steps, skip them by hand ({by_hand}), or rerun with --set "
            f"guard.max_rollbacks={g.max_rollbacks + 1}"))
    kept = [(folder, step) for folder in complete_checkpoints(plan.config.layout.checkpoints)
            if (step := read_record(folder).step) < first]
    if not kept:
        raise gave_up(spike, at_step, (
            f"spike guard: {what} at {span}, and no checkpoint of this run precedes step {first} to roll back to; "
            f"stopping without saving. Rerun with {by_hand} --restart-from-scratch to "
            f"train again from step 0 without those batches, or lower optimizer.lr or raise schedule.warmup_steps"))
    folder, step = kept[-1]
    return RollbackEvent(max(step + 1, first - g.margin), min(last + g.margin, plan.end_step),
                         tuple(sorted({*spike.window, *spike.since})), spike.nonfinite, folder.name, at_step)


def plan_after_rollback(plan: RunPlan, ledger: Ledger, info: TokenizerInfo) -> RunPlan:
    """The run planned again with `ledger`'s skips (a rollback's among them): its start is the newest checkpoint that
    trained on none of them, the later ones are rolled back, as at a resume with `--skip-steps`."""
    config = plan.config
    start, rolled_back, anneal_from, problems = find_start(config, info, plan.world_size, ledger.skipped)
    if problems or start is None:
        raise PipelineError(f"spike guard: the rollback cannot start ({'; '.join(problems) or 'no checkpoint'})")
    return build_plan(config, plan.world_size, plan.layouts, start, rolled_back, anneal_from, ledger)
