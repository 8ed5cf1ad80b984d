"""ZeRO 0's gradient all-reduce on several ranks, as torch's DDP does it: in buckets, each started while the backward
still runs, in the training precision's dtype, and only at the accumulation boundary.

DeepSpeed at ZeRO 0 all-reduces every gradient after the whole backward (`buffered_allreduce_fallback`), in one
flat fp32 buffer: nothing overlaps the backward, and a bf16 run moves twice bf16's bytes. DDP's reducer overlaps,
but it works by wrapping the module, which DeepSpeed's engine owns (and whose state dict would gain a `module.`
prefix), so its scheme is done here with torch's per-parameter hooks:
- the gradients are cut into buckets of about `BUCKET_BYTES` in reverse parameter order, the order the backward
  finishes them (the last layers first), as DDP's are;
- a hook on each parameter (`register_post_accumulate_grad_hook`) counts it ready; a bucket whose gradients are
  all ready is flattened and its all-reduce started (`async_op`), buckets in their order on every rank, so the
  collectives match while the backward goes on below;
- at DeepSpeed's own all-reduce (`engine.allreduce_gradients`, called at the boundary after the backward) the
  buckets not started yet (a parameter that had no gradient gets zeros, as DeepSpeed gives it) are started, every
  bucket is waited for, and the sums, divided by the world size, go back into the gradients;
- between accumulation micro-steps nothing is sent: the gradients accumulate in fp32 on each rank;
- in bf16 the buckets travel in bf16 and come back to the fp32 gradients (DDP's `bf16_compress_hook`): half the
  bytes. fp32 travels in fp32, adding what DeepSpeed adds (the same sum, then × 1/world), so its steps are the same
  to the bit; fp16 travels in fp32 too, since its loss-scaled gradients could overflow fp16's range.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

BUCKET_BYTES = 25 * 2**20
"""DDP's default bucket size (`bucket_cap_mb` 25)."""
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float32}
"""What the buckets travel in, by `train.precision`."""


@dataclass
class Bucket:
    params: list[torch.nn.Parameter]
    waiting: int = 0
    """Gradients of this bucket not ready yet in this backward."""
    flat: torch.Tensor | None = None
    work: object | None = field(default=None, repr=False)


class GradientBuckets:
    """One rank's bucketed all-reduce of `params`' gradients, started by their hooks while the backward runs."""

    def __init__(self, params: list[torch.nn.Parameter], precision: str, world_size: int,
                 bucket_bytes: int | None = None):
        self.dtype, self.world_size = DTYPES[precision], world_size
        bucket_bytes = bucket_bytes or BUCKET_BYTES
        self.element_size = size = torch.tensor([], dtype=self.dtype).element_size()
        self.buckets: list[Bucket] = []
        for param in reversed([p for p in params if p.requires_grad]):
            if not self.buckets or sum(p.numel() for p in self.buckets[-1].params) * size >= bucket_bytes:
                self.buckets.append(Bucket([]))
            self.buckets[-1].params.append(param)
        self.bucket_of = {param: i for i, bucket in enumerate(self.buckets) for param in bucket.params}
        self.armed, self.started = False, 0
        self.events: list[tuple[str, int]] = []
        """This backward's ("ready", bucket) and ("started", bucket) in the order they happened (tests read it)."""
        for param in self.bucket_of:
            param.register_post_accumulate_grad_hook(self._ready)

    @property
    def bytes_per_step(self) -> int:
        """What one rank sends into the all-reduce a step (each gradient once, in the buckets' dtype)."""
        return sum(p.numel() for p in self.bucket_of) * self.element_size

    def arm(self, boundary: bool) -> None:
        """Before a micro-step's backward: only the accumulation boundary's sends its gradients."""
        self.armed, self.started, self.events = boundary, 0, []
        for bucket in self.buckets:
            bucket.waiting = len(bucket.params)

    def _ready(self, param: torch.nn.Parameter) -> None:
        if not self.armed:
            return
        index = self.bucket_of[param]
        self.buckets[index].waiting -= 1
        if self.buckets[index].waiting == 0:
            self.events.append(("ready", index))
            while self.started < len(self.buckets) and self.buckets[self.started].waiting == 0:
                self._start(self.started)

    def _start(self, index: int) -> None:
        bucket = self.buckets[index]
        for param in bucket.params:
            if param.grad is None:  # every rank reduces the same buckets, as DeepSpeed's fallback does
                param.grad = torch.zeros_like(param)
        bucket.flat = _flatten_dense_tensors([p.grad for p in bucket.params]).to(self.dtype)
        bucket.work = dist.all_reduce(bucket.flat, async_op=True)
        self.events.append(("started", index))
        self.started = index + 1

    def finish(self) -> None:
        """After each backward: at the boundary, start what the hooks did not, wait, and put the mean back."""
        if not self.armed:
            return
        while self.started < len(self.buckets):
            self._start(self.started)
        for bucket in self.buckets:
            bucket.work.wait()
            grads = [p.grad for p in bucket.params]
            mean = bucket.flat.to(grads[0].dtype).mul_(1.0 / self.world_size)
            torch._foreach_copy_(grads, _unflatten_dense_tensors(mean, grads))
            bucket.flat = bucket.work = None
        self.armed = False


def reduce_in_buckets(engine, precision: str) -> GradientBuckets:
    """Give a ZeRO 0 engine on several ranks the bucketed all-reduce in place of DeepSpeed's: its `backward` arms
    the buckets at the boundary, its `allreduce_gradients` finishes them."""
    buckets = GradientBuckets(list(engine.module.parameters()), precision, engine.world_size)
    backward = engine.backward

    def armed_backward(loss, *args, **kwargs):
        buckets.arm(engine.is_gradient_accumulation_boundary())
        return backward(loss, *args, **kwargs)

    engine.backward = armed_backward
    engine.allreduce_gradients = lambda *args, **kwargs: buckets.finish()
    return buckets
