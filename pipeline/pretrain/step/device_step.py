"""What keeps DeepSpeed's optimizer step on the device: between logging steps nothing is read back to the host.

A read (`.item()`, `bool()` of a tensor, a synchronize) makes the host wait until the device has run every
queued kernel, so the next step's kernels are not queued meanwhile. The engine's config (engine.py) already
avoids DeepSpeed's per-tensor bf16/fp16 wrapper at ZeRO 0 and its throughput timer; what DeepSpeed 0.19.8
still does on the host in a step, and what is done here instead:
- ZeRO 0 clips with one norm and one multiply per tensor (~800 operator calls for RoBERTa-large's 394
  tensors; no read): torch's multi-tensor norm and clip do it in a few kernels, and the norm stays a device
  tensor for the run log (`engine.get_global_grad_norm()`, which DeepSpeed leaves None at ZeRO 0 in fp32) and
  for the spike guard, which judges the step there, between its norm and its update (spike_guard.py). A step
  whose norm is not finite, or that the guard leaves out, reaches the optimizer as `found_inf`
  (`skip_updates_on`: torch's fused AdamW, LAMB and StableAdamW take it), which then leaves the whole update
  out; a non-finite gradient is zeroed first where the optimizer computes the left-out update anyway.
  DeepSpeed would apply a non-finite gradient at ZeRO 0: a NaN in one batch would reach every weight;
- ZeRO 0 on one rank flattens every gradient, "averages" it over that one rank and copies it back: off; on
  several it all-reduces every gradient after the whole backward in one fp32 buffer: bucketed instead, each
  bucket started while the backward runs, in bf16 for a bf16 run (gradient_buckets.py);
- ZeRO 0 in fp16 scales the loss with torch's GradScaler built with DeepSpeed's defaults, whatever the
  `fp16` section says, and saves it in no checkpoint: built from the section here, and its state goes into
  the checkpoint (`extra_state`);
- ZeRO 1/2 ask the host whether the gradient norm is finite before clipping each parameter group
  (`unscale_and_clip_grads`): the same arithmetic, with the check on the device (fp32 and bf16; DeepSpeed's
  own fp16 is left as it is). In bf16, whose overflow check is off (engine.py), a step with a non-finite norm is
  left out by the fused AdamW under DeepSpeed's partitions (`found_inf`), or its gradients zeroed, so it never
  reaches the weights.

What still reads: ZeRO 1/2 in fp32 ask once a step whether the norm is finite, to skip a non-finite step
(in `step()` itself, whose other work is not replaceable piecemeal), ZeRO 3 likewise, and DeepSpeed's own
fp16 (ZeRO 1-3) checks for overflow. No shipped config trains so.
tests/pretrain/test_device_reads.py counts them on CPU.
"""

from __future__ import annotations

import math
import types
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.step.gradient_buckets import reduce_in_buckets
from pipeline.pretrain.step.spike_guard import SpikeGuard

DEFAULT_SCALER_KEYS = {"initial_scale_power": 16, "loss_scale_window": 1000}
"""DeepSpeed's fp16 defaults: a first loss scale of 2^16, doubled after 1,000 steps without an overflow."""


def keep_step_on_device(engine, config: PretrainConfig, guard: SpikeGuard) -> None:
    """Replace, on this engine, DeepSpeed's host-side parts of the step (the module docstring lists them); at ZeRO 0
    the spike `guard` judges each step in its clipping."""
    t = config.train
    if t.zero_stage == 0:
        if t.precision == "fp16":
            engine.torch_autocast_z0_gradscaler = grad_scaler(config.deepspeed.get("fp16", {}))
        leave_out = torch.zeros((), device=engine.device) if takes_found_inf(engine.optimizer) else None
        if leave_out is not None:
            skip_updates_on(engine.optimizer, leave_out, scaled=loss_scaler(engine) is not None)
        guard.can_skip = leave_out is not None
        engine.clip_fp32_gradients = partial(clip_gradients, engine, guard, leave_out)
        if dist.get_world_size() == 1:
            engine.enable_backward_allreduce = False
        else:
            engine.gradient_buckets = reduce_in_buckets(engine, t.precision)
    elif t.zero_stage in (1, 2) and t.precision != "fp16":  # DeepSpeed's fp16 reads its overflow check anyway
        engine.optimizer.unscale_and_clip_grads = types.MethodType(unscale_and_clip_grads, engine.optimizer)


def takes_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's step takes `found_inf` and leaves the whole update out at 1, as GradScaler uses it:
    torch's fused Adam and AdamW, and LAMB and StableAdamW (optimizers.py)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def needs_finite_gradients(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a step it leaves out must still be handed finite gradients: torch's fused kernel skips a left-out
    update whole, and LAMB and StableAdamW zero them themselves; the others compute it and scale it by 0, and NaN × 0
    is NaN."""
    return not (optimizer.defaults.get("fused", False) or getattr(optimizer, "takes_nonfinite_gradients", False))


def clip_gradients(engine, guard: SpikeGuard, leave_out: torch.Tensor | None) -> None:
    """ZeRO 0's clipping: torch's multi-tensor norm and clip to `gradient_clipping` (`clip_grad_norm_(foreach=True)`
    in its two halves), the norm kept on the device; then the spike `guard` judges the step, and a step with a
    non-finite norm, or one the guard leaves out, is left out (`leave_out`: the fused kernel's `found_inf`) or its
    gradients zeroed (no such kernel).

    Every rank holds the whole averaged gradient at ZeRO 0, so its norm is the global one without a collective. With
    clipping off, DeepSpeed is told an infinite clip (engine.py), so that the norm is still taken and checked.
    """
    params = list(engine.module.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    if math.isfinite(engine.gradient_clipping()):
        torch.nn.utils.clip_grads_with_norm_(params, engine.gradient_clipping(), norm, foreach=True)
    engine._global_grad_norm = norm
    guard.judge(norm)
    nonfinite = ~torch.isfinite(norm)
    if leave_out is not None:
        leave_out.copy_(torch.maximum(guard.skip, nonfinite.float()))
    if leave_out is None or needs_finite_gradients(engine.optimizer):
        for grad in grads:  # NaN × 0 is NaN: the gradients are filled, not scaled
            grad.masked_fill_(nonfinite, 0.0)


def skip_updates_on(optimizer: torch.optim.Optimizer, verdict: torch.Tensor, *, scaled: bool) -> None:
    """Hand `verdict` (a step to leave out: a non-finite norm, or the spike guard's) to torch's fused AdamW as
    `found_inf`: at 1 its kernel leaves the whole update out (weights, moments) and takes its step counters back, all
    on the device (torch/optim/adam.py `_fused_adam`).

    fp16's GradScaler sets `found_inf` itself before each step (its overflow check) and removes it after: `scaled`,
    the two are combined just before the update, so either leaves it out and only an overflow changes the scale.
    """
    if not scaled:
        optimizer.found_inf = verdict
        return
    optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: setattr(opt, "found_inf", torch.maximum(opt.found_inf, verdict)))


def unscale_and_clip_grads(self, grad_groups_flat: list, total_norm) -> None:
    """DeepSpeed 0.19.8's `DeepSpeedZeroOptimizer.unscale_and_clip_grads`, its one host read done on the device.

    DeepSpeed reads `is_invalid_grad_norm(total_norm)` (a non-finite norm, or its -1 sentinel for one) to treat
    the norm as infinite, which scales the gradients to 0; `torch.where` gives the same scale without the read. A
    scale of 0 leaves a NaN a NaN, though, and bf16 runs without DeepSpeed's overflow check: so such a step is left
    out by the fused AdamW under the partitions (`found_inf`), or its gradients are zeroed.
    """
    total_norm = torch.as_tensor(total_norm, dtype=torch.float, device=self.device)
    valid = torch.isfinite(total_norm) & (total_norm >= 0)
    parts = [part for grad in grad_groups_flat for part in (grad if isinstance(grad, list) else [grad])]
    if takes_found_inf(self.optimizer):  # the whole update left out, moments and step counter alike
        self.optimizer.found_inf = (~valid).float()
    if not takes_found_inf(self.optimizer) or needs_finite_gradients(self.optimizer):
        for part in parts:  # NaN × 0 is NaN: the gradients are filled, not scaled
            part.data.masked_fill_(~valid, 0.0)
    if self.clip_grad == 0.0 and self.loss_scale == 1.0:
        return
    combined_scale = self.loss_scale
    if self.clip_grad > 0.0:
        clip_norm = torch.where(valid, total_norm, torch.full_like(total_norm, math.inf))
        clip = torch.clamp(((clip_norm / self.loss_scale) + 1e-6) / self.clip_grad, min=1.0)
        combined_scale = clip * self.loss_scale
    for part in parts:
        part.data.mul_(1.0 / combined_scale)


def grad_scaler(fp16: dict[str, Any]) -> torch.amp.GradScaler:
    """ZeRO 0's fp16 loss scaler, from the `deepspeed.fp16` section's keys it has a counterpart for (DeepSpeed's
    defaults where absent; config.py refuses the others): the first scale 2^initial_scale_power, halved at an
    overflow, doubled after loss_scale_window steps without one."""
    from deepspeed.accelerator import get_accelerator

    keys = {**DEFAULT_SCALER_KEYS, **{k: v for k, v in fp16.items() if k in DEFAULT_SCALER_KEYS}}
    return torch.amp.GradScaler(get_accelerator().device_name(), init_scale=2.0 ** keys["initial_scale_power"],
                                growth_interval=keys["loss_scale_window"])


def loss_scaler(engine) -> torch.amp.GradScaler | None:
    """The GradScaler of an fp16 engine at ZeRO 0; None otherwise."""
    return getattr(engine, "torch_autocast_z0_gradscaler", None)


def loss_scale(engine) -> float | None:
    """The current fp16 loss scale (a device read: for logging steps), None without loss scaling."""
    if (scaler := loss_scaler(engine)) is not None:
        return scaler.get_scale()
    return getattr(engine.optimizer, "cur_scale", None)


def extra_state(engine) -> dict[str, Any]:
    """What a checkpoint holds beyond DeepSpeed's engine state (its `client_state`): ZeRO 0 fp16's loss scaler."""
    scaler = loss_scaler(engine)
    return {} if scaler is None else {"grad_scaler": scaler.state_dict()}


def load_extra_state(engine, client_state: dict[str, Any] | None) -> None:
    """Put `extra_state` back (a checkpoint without it keeps the fresh scaler)."""
    scaler = loss_scaler(engine)
    if scaler is not None and client_state and "grad_scaler" in client_state:
        scaler.load_state_dict(client_state["grad_scaler"])
