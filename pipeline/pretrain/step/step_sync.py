"""What the ranks agree on after each step.

`StepSync` keeps device→host syncs as few as the loop allows. Every step, the ranks vote on a stop
request: a host value, so it goes through a gloo group (the default group on CPU, a gloo subgroup
beside NCCL on GPU) and never waits on the device. The losses stay on the device, summed over the
steps since the last check, and come to the host in one all-reduce only when a component asks for them
(the run log at a logging step, the validation and the checkpointer at theirs: each says when it is due)
or a stop is voted. The same all-reduce gathers a few host figures from every rank (the loader's wait
share) and the spike guard's device figures (spike_guard.py), so no rank's is lost and no collective is
added. A non-finite loss is still caught before anything is saved, because the window's sum is non-finite
if any of its steps was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from pipeline.common.errors import PipelineError


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
    stop: bool = False
    """A rank was asked to stop (the vote of this step)."""

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

    def __init__(self, world_size: int, due: Sequence[Callable[[int], bool]] = (),
                 host: Callable[[], Sequence[float]] = tuple, device: Callable[[], torch.Tensor | None] = lambda: None):
        """`due`: when each component wants the losses (after a step, 1-based); `host` and `device`: each rank's host
        figures and the guard's device figures a check gathers with them."""
        self.world_size, self.due, self.host, self.device = world_size, tuple(due), host, device
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

    def after_step(self, step: int, stop_requested: bool) -> CheckedLosses | None:
        """After `step` steps: the ranks' stop vote, and when a component is due or a stop is voted, the check."""
        stop = self.stop_requested(stop_requested)
        if not stop and not any(due(step) for due in self.due):
            return None
        checked = self.check(self.host(), self.device())
        checked.stop = stop
        return checked

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
