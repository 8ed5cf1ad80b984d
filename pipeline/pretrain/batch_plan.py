"""The one owner of the batch arithmetic: global batch = micro batch × world size × accumulation."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.common.errors import PipelineError


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's `global_batch_size` sequences are split over ranks and micro steps.

    Micro batch `k` of a step (0 ≤ k < world_size × accumulation) holds the step's sequences
    `[k·micro, (k+1)·micro)`; rank `r` runs micro batches `r, r + world_size, …`. Every layout of
    the same global and micro batch therefore sees the same micro batches.
    """

    global_batch_size: int
    micro_batch_size: int
    world_size: int
    accumulation: int

    @classmethod
    def derive(cls, global_batch_size: int, micro_batch_size: int, world_size: int, *,
               keys: tuple[str, str] = ("train.global_batch_size", "train.micro_batch_size")) -> BatchPlan:
        """The plan for these sizes; `keys` name the config keys that set them, for the error message."""
        problem = batch_problem(global_batch_size, micro_batch_size, world_size, keys=keys)
        if problem:
            raise PipelineError(problem)
        return cls(global_batch_size, micro_batch_size, world_size,
                   global_batch_size // (micro_batch_size * world_size))

    @property
    def micro_batches_per_step(self) -> int:
        return self.world_size * self.accumulation

    def micro_batch_index(self, rank: int, micro_step: int) -> int:
        """Position in the global batch of rank `rank`'s `micro_step`-th micro batch of a step."""
        return micro_step * self.world_size + rank


def batch_problem(global_batch_size: int, micro_batch_size: int, world_size: int, *,
                  keys: tuple[str, str] = ("train.global_batch_size", "train.micro_batch_size")) -> str | None:
    """Why these sizes cannot form a step, or None when they can."""
    global_key, micro_key = keys
    if min(global_batch_size, micro_batch_size, world_size) < 1:
        return (f"{global_key} ({global_batch_size}), {micro_key} ({micro_batch_size}) "
                f"and the world size ({world_size}) must all be positive")
    per_micro_step = micro_batch_size * world_size
    if global_batch_size % per_micro_step:
        return (f"{global_key} {global_batch_size} is not divisible by {micro_key} "
                f"{micro_batch_size} × world size {world_size} = {per_micro_step} "
                f"(gradient accumulation would be {global_batch_size / per_micro_step:g}); choose a global "
                f"batch that is a multiple of {per_micro_step}, or another micro batch")
    return None
