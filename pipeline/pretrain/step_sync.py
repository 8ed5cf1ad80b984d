"""What the ranks agree on after each step, with as few device→host syncs as the loop allows.

Every step, the ranks vote on a stop request. The vote is a host value, so it goes through a gloo
group (the default group on CPU, a gloo subgroup beside NCCL on GPU) and never waits on the device.
The losses stay on the device, summed over the steps since the last check, and come to the host in
one all-reduce only when the loop needs them: to log, before an evaluation or a checkpoint, and at
the end. A non-finite loss is still caught before anything is saved, because the window's sum is
non-finite if any of its steps was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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

    def check(self) -> CheckedLosses:
        """One all-reduce and one device→host copy of the losses since the last check; starts a new window."""
        loss = self._loss
        values = torch.stack([loss, *self._extras.values(), self._window,
                              torch.tensor(float(self._tokens), device=loss.device)])
        dist.all_reduce(values)
        values = values.cpu().tolist()
        n = self.world_size
        checked = CheckedLosses(values[0] / n, {k: values[1 + i] / n for i, k in enumerate(self._extras)},
                                values[-2] / n, self._first_step, values[-1])
        self._reset()
        return checked
