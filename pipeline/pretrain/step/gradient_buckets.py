"""ZeRO 0's gradient all-reduce on several ranks: torch's own DDP reducer, attached to the engine's module.

DeepSpeed at ZeRO 0 all-reduces every gradient after the whole backward (`buffered_allreduce_fallback`), in one
flat buffer: nothing overlaps the backward. Here torch's DDP reducer does it instead, through
`torch.distributed._composable.replicate`: the reducer without a wrapper module, so DeepSpeed's engine keeps owning
the module, its forward and its backward, and the state dict keeps its keys (a `DistributedDataParallel` wrapper
would add a `module.` prefix to every checkpoint and export). DeepSpeed's own all-reduce is turned off
(`enable_backward_allreduce`). What the reducer brings:
- the gradients are cut into buckets in reverse parameter order, the order the backward finishes them (the first
  bucket 1 MiB so that the first all-reduce starts early, the rest 25 MiB), and rebuilt after the first step in the
  order they were made ready; a bucket's all-reduce starts as soon as its gradients are ready, while the backward
  runs below;
- a parameter that gets no gradient in a backward (BERT's NSP head without `next_sentence_loss`) is found from the
  forward's graph and counted ready at once (`find_unused_parameters`), so its bucket does not wait for the end of
  the backward; one that no rank used keeps no gradient, as on one rank, so AdamW leaves it as it is on any number
  of ranks (a zero gradient would still let weight decay shrink it);
- a gradient made ready twice in one backward is an error ("marked ready twice"), not a silent double count;
- only the accumulation boundary sends: before each forward the engine tells the reducer whether this micro-step's
  backward ends the step (`set_requires_gradient_sync`); between, the gradients accumulate on each rank.

The arithmetic is DeepSpeed's (`allreduce_bucket`), by the communication hook `reduce_bucket`: each bucket travels in
`communication_data_type` (default: bf16 for a bf16 run, as DDP's `bf16_compress_hook` sends it, half fp32's bytes;
fp32 otherwise, fp16's loss-scaled gradients included, which could overflow fp16's range), multiplied by
1/`gradient_predivide_factor` before the sum and by `gradient_predivide_factor`/world after it (or by 1/world before
it, with `prescale_gradients`). By default that is the sum, then × 1/world: fp32 steps are DeepSpeed's to the bit.
One difference: both multiplications are done in the gradients' own dtype, around the cast to the communication dtype
and back (DeepSpeed does them in the communication dtype), so that a factor keeps a gradient past fp16's range in
range, which is what it is for; for factors that are powers of two the results are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

BUCKET_CAP_MB: float | None = None
"""The reducer's bucket size in MiB; None: DDP's defaults (the first bucket 1 MiB, the others 25 MiB). At least 1 with
compiled blocks: dynamo splits a compiled graph where the buckets end, starting with a 1 MiB bucket, and refuses a
smaller cap (tests set 1/64 to give a 2-layer model several buckets, uncompiled)."""
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float32}
"""What the buckets travel in, by `train.precision`, unless `deepspeed.communication_data_type` says otherwise."""
COMMUNICATION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""`deepspeed.communication_data_type`'s values (DeepSpeed's own)."""


@dataclass
class Reduction:
    """The state of DDP's communication hook `reduce_bucket`: DeepSpeed's dtype and scaling."""

    dtype: torch.dtype
    before: float
    """Multiplies the bucket before the sum."""
    after: float
    """Multiplies the sum."""
    events: list[tuple[str, int]] = field(default_factory=list)
    """("started", bucket index) for each bucket whose all-reduce started, in order, since the last boundary forward
    (tests read it)."""


def reduce_bucket(state: Reduction, bucket):  # DDP refuses a hook whose `bucket` is annotated with a string
    """DDP's communication hook: a bucket's mean over the ranks, scaled as DeepSpeed's `allreduce_bucket` scales it
    (the same results where the factors are powers of two); the result goes back into the bucket, which DDP copies
    into the gradients."""
    buffer = bucket.buffer()
    if state.before != 1.0:  # before the cast, which DeepSpeed does first: a gradient past fp16's range still fits
        buffer.mul_(state.before)
    sent = buffer.to(state.dtype) if buffer.dtype != state.dtype else buffer
    state.events.append(("started", bucket.index()))

    def back_into_the_bucket(future: torch.futures.Future) -> torch.Tensor:
        total = future.value()[0]
        summed = total if sent is buffer else buffer.copy_(total)
        return summed.mul_(state.after) if state.after != 1.0 else summed

    return dist.all_reduce(sent, async_op=True).get_future().then(back_into_the_bucket)


def reduction(precision: str, deepspeed: dict[str, Any], world_size: int) -> Reduction:
    """The hook for `train.precision` and the `deepspeed` section's `communication_data_type`,
    `gradient_predivide_factor` and `prescale_gradients` (config.py checked their values)."""
    named = deepspeed.get("communication_data_type")
    dtype = COMMUNICATION_DTYPES[named.lower()] if named is not None else DTYPES[precision]
    if deepspeed.get("prescale_gradients", False):
        return Reduction(dtype, 1.0 / world_size, 1.0)
    factor = float(deepspeed.get("gradient_predivide_factor", 1.0))
    return Reduction(dtype, 1.0 / factor, factor / world_size if factor != world_size else 1.0)


class GradientBuckets:
    """One rank's view of the reducer on the engine's module: what it sends a step, and the last step's events."""

    def __init__(self, module: torch.nn.Module, hook: Reduction):
        self.module, self.hook = module, hook
        self.element_size = torch.tensor([], dtype=hook.dtype).element_size()

    @property
    def bytes_per_step(self) -> int:
        """What one rank sends into the all-reduce a step (each gradient once, in the buckets' dtype)."""
        return sum(p.numel() for p in self.module.parameters() if p.requires_grad) * self.element_size

    @property
    def events(self) -> list[tuple[str, int]]:
        return self.hook.events

    def before_forward(self, boundary: bool) -> None:
        """Only the accumulation boundary's backward sends its gradients."""
        self.module.set_requires_gradient_sync(boundary)
        if boundary:
            self.hook.events.clear()


def attach_reducer(module: torch.nn.Module, precision: str, deepspeed: dict[str, Any]) -> GradientBuckets:
    """torch's DDP reducer on `module` (every rank at once: it broadcasts rank 0's weights and checks the shapes
    match), sending with `reduction`'s hook."""
    from torch.distributed._composable import replicate

    hook = reduction(precision, deepspeed, dist.get_world_size())
    kwargs = {} if BUCKET_CAP_MB is None else {"bucket_cap_mb": BUCKET_CAP_MB}
    # The buffers (position ids) are the same on every rank and never trained: not sent at each forward.
    replicate(module, find_unused_parameters=True, forward_sync_buffers=False, **kwargs)
    module.register_comm_hook(hook, reduce_bucket)
    # replicate builds the reducer at the first forward otherwise, with collectives: a first forward on some ranks
    # only (an evaluation) would wait forever. Every rank builds it here, together.
    replicate.state(module).lazy_init()
    return GradientBuckets(module, hook)
