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

    def micro_batch_index(self, rank: int, micro_step: int) -> int:
        """Position in the global batch of rank `rank`'s `micro_step`-th micro batch of a step."""
        return micro_step * self.world_size + rank


# batch_problem and ramp_problems stay here, beside the arithmetic they check: BatchPlan.derive raises
# batch_problem's answer, and both stages' preflights (pretrain/preflight.py, finetune/preflight.py) call them.
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


@dataclass(frozen=True)
class RampSegment:
    """Optimizer steps [start, end) that run at one global batch during a batch-size warmup."""

    start: int
    end: int
    global_batch_size: int


def batch_ramp(full: int, first: int, warmup_tokens: int, seq_len: int, max_steps: int) -> list[RampSegment]:
    """The global batch of every step under a batch-size warmup, as segments of equal batch.

    The rule: before step s, T tokens have been drawn (sequences × `seq_len`, padding included, so
    the rule is a function of the step alone). The step's batch is

        b(T) = ⌊(first + (full − first) · T / warmup_tokens) / first⌋ · first   while T < warmup_tokens,
        b(T) = full                                                           after,

    linear in tokens, rounded down to a multiple of `first` (itself a multiple of micro batch ×
    world size, checked at load), so every step has a whole accumulation. `first` divides `full`.
    Integer arithmetic throughout: the same steps on every rank and every resume.
    """
    segments: list[RampSegment] = []
    drawn, step = 0, 0  # tokens before `step`
    while step < max_steps:
        if drawn >= warmup_tokens:
            batch = full
        else:
            batch = min(full, (first * warmup_tokens + (full - first) * drawn) // (warmup_tokens * first) * first)
        if segments and segments[-1].global_batch_size == batch:
            segments[-1] = RampSegment(segments[-1].start, step + 1, batch)
        else:
            segments.append(RampSegment(step, step + 1, batch))
        if batch == full:  # the rest of the run
            segments[-1] = RampSegment(segments[-1].start, max_steps, full)
            break
        drawn += batch * seq_len
        step += 1
    return segments


def ramp_problems(full: int, first: int | None, warmup_tokens: int, micro_batch_size: int,
                  world_size: int) -> list[str]:
    """Why `train.batch_warmup_tokens` / `train.batch_warmup_start` cannot ramp to `full`; empty when they can."""
    if warmup_tokens < 0:
        return [f"train.batch_warmup_tokens: must be ≥ 0 (0: no batch warmup), got {warmup_tokens}"]
    if not warmup_tokens:
        return []
    first = micro_batch_size if first is None else first
    per_micro_step = micro_batch_size * world_size
    problems = []
    if first < 1 or first % per_micro_step:
        problems.append(f"train.batch_warmup_start {first}: the first global batch must be a positive multiple of "
                        f"train.micro_batch_size {micro_batch_size} × world size {world_size} = {per_micro_step}; "
                        f"set train.batch_warmup_start={per_micro_step} (or a multiple)")
    elif full % first:
        problems.append(f"train.batch_warmup_start {first} must divide train.global_batch_size {full} (the batch "
                        f"rises in multiples of it); choose a divisor such as {per_micro_step}")
    return problems
