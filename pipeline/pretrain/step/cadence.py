"""The loop's step-by-step helpers: when it logs, evaluates and saves, what the ranks agree on after each step,
and the watchdog around a step.

`Cadence` answers, for the step just finished, "log, evaluate, save, stop?" from the config's
periods alone. The last step always logs; it neither evaluates nor saves here, because the
run's end does both once (`Pretrainer._finish`). `StepGuard` wraps a step in the rank watchdog (with
several ranks), skipping the first step of a process, which carries one-off costs (workers starting,
compilation).

`StepSync` keeps device→host syncs as few as the loop allows. Every step, the ranks vote on a stop
request: a host value, so it goes through a gloo group (the default group on CPU, a gloo subgroup
beside NCCL on GPU) and never waits on the device. The losses stay on the device, summed over the
steps since the last check, and come to the host in one all-reduce only when the loop needs them: to
log, before an evaluation or a checkpoint, and at the end. The same all-reduce gathers a few host
figures from every rank (the loader's wait share) and the spike guard's device figures (spike_guard.py),
so no rank's is lost and no collective is added. A non-finite loss is still caught before anything is
saved, because the window's sum is non-finite if any of its steps was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from pipeline.common.errors import PipelineError
from pipeline.common.lost_rank import RankWatchdog, lost_rank_message
from pipeline.common.topology import Topology


@dataclass(frozen=True)
class Due:
    """What the loop does after one step."""

    log: bool
    evaluate: bool
    save: bool

    @property
    def any(self) -> bool:
        return self.log or self.evaluate or self.save


@dataclass(frozen=True)
class Cadence:
    """The loop's periods, in optimizer steps, and the step it ends at."""

    end_step: int
    log_every: int
    eval_every: int
    """0: evaluate only at the end."""
    save_every: int

    def due(self, step: int) -> Due:
        """After optimizer step `step` (1-based: the number of steps done)."""
        last = self.done(step)
        return Due(log=step % self.log_every == 0 or last,
                   evaluate=bool(self.eval_every) and step % self.eval_every == 0 and not last,
                   save=step % self.save_every == 0 and not last)

    def done(self, step: int) -> bool:
        return step >= self.end_step


class StepGuard:
    """With several ranks, a watchdog around each step after the process's first: a thread that ends this rank when
    a step outlasts `timeout_s`, its message saying where a rerun resumes (`resume_hint`)."""

    def __init__(self, first_step: int, topology: Topology, timeout_s: float, resume_hint: Callable[[], str]):
        self.first_step, self.watchdog = first_step, None
        if topology.world_size > 1:
            self.watchdog = RankWatchdog(timeout_s, lambda where: lost_rank_message(
                topology.rank, topology.world_size, where, timeout_s, resume_hint(),
                f"the step has waited {timeout_s:g} s"))

    def around(self, step: int) -> AbstractContextManager:
        """Guard optimizer step `step` (0-based, about to run)."""
        if self.watchdog is None or step <= self.first_step:
            return nullcontext()
        return self.watchdog.guard(f"at step {step + 1}")

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.close()


@dataclass
class CheckedLosses:
    """The host's view at a check: this step's losses (rank mean), the window's, and its tokens (all ranks)."""

    loss: float
    extras: dict[str, float]
    window_loss: float
    first_step: int
    tokens: float
    ranks: list[list[float]] = field(default_factory=list)
    """Each rank's host values given to the check (`StepSync.check`), by rank."""
    guard: list[float] = field(default_factory=list)
    """The spike guard's values given to the check, as the ranks' mean (they are the same on every rank)."""

    def nonfinite_error(self, step: int, newest: Path | None) -> PipelineError:
        """What stops a run whose loss became non-finite by `step`, naming its last good checkpoint `newest`."""
        loss = self.loss if not math.isfinite(self.loss) else self.window_loss
        since = "" if self.first_step == step else (
            f" (checked at logging, evaluation and checkpoint steps: it became non-finite at one of steps "
            f"{self.first_step}-{step})")
        return PipelineError(f"the training loss is {loss} at step {step}{since}; stopping without saving. The last "
                             f"good checkpoint is {newest or 'none (no checkpoint yet)'}. Lower optimizer.lr, raise "
                             f"schedule.warmup_steps or check the data")


class StepSync:
    """Stop votes every step; losses accumulated on the device and reduced only at checks."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._vote_group = None
        if world_size > 1 and dist.get_backend() != "gloo":
            self._vote_group = dist.new_group(backend="gloo")  # every rank calls this, in the same order
        self._reset()

    def _reset(self) -> None:
        self._window: torch.Tensor | None = None
        self._tokens = 0
        self._first_step: int | None = None

    def record(self, step: int, micro_losses: list[torch.Tensor], extras: dict[str, list[torch.Tensor]],
               tokens: int) -> None:
        """Keep this step's losses on the device (no sync)."""
        self._loss = torch.stack(micro_losses).mean()
        self._extras = {k: torch.stack(v).mean() for k, v in extras.items()}
        self._window = self._loss if self._window is None else self._window + self._loss
        self._tokens += tokens
        self._first_step = step if self._first_step is None else self._first_step

    def stop_requested(self, local: bool) -> bool:
        """True on every rank when any rank has a stop request: one host all-reduce, no device sync."""
        if self.world_size == 1:
            return local
        flag = torch.tensor([float(local)])
        dist.all_reduce(flag, group=self._vote_group)
        return flag.item() > 0

    def check(self, host: Sequence[float] = (), guard: torch.Tensor | None = None) -> CheckedLosses:
        """One all-reduce and one device→host copy of the losses since the last check, which also gathers each
        rank's `host` values (every rank fills only its own slots of the sum) and the spike `guard`'s device values
        (float64: they hold step numbers); starts a new window."""
        loss = self._loss
        guard = torch.zeros(0, dtype=torch.float64, device=loss.device) if guard is None else guard
        own = torch.zeros(self.world_size, len(host), dtype=torch.float64)
        own[dist.get_rank()] = torch.tensor(host, dtype=own.dtype)
        summed = torch.stack([loss, *self._extras.values(), self._window,
                              torch.tensor(float(self._tokens), device=loss.device)]).double()
        values = torch.cat([summed, own.flatten().to(loss.device), guard])
        dist.all_reduce(values)
        values = values.cpu().tolist()
        n, m, k = self.world_size, len(summed), len(host)
        ranks = [values[m + r * k: m + (r + 1) * k] for r in range(n)] if k else []
        checked = CheckedLosses(values[0] / n, {key: values[1 + i] / n for i, key in enumerate(self._extras)},
                                values[m - 2] / n, self._first_step, values[m - 1], ranks,
                                [v / n for v in values[m + n * k:]])
        self._reset()
        return checked
