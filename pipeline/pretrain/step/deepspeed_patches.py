"""The DeepSpeed internals the pipeline patches, all here, each checked before it is patched: what keeps DeepSpeed's
optimizer step on the device (between logging steps nothing is read back to the host), and ZeRO 0's all-reduce.

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
  several it all-reduces every gradient after the whole backward in one buffer: torch's DDP reducer instead, each
  bucket started while the backward runs (gradient_buckets.py; `reduce_with_torch`);
- ZeRO 0 in fp16 scales the loss with torch's GradScaler built with DeepSpeed's defaults, whatever the
  `fp16` section says, and saves it in no checkpoint: built from the section here, and its state goes into
  the checkpoint (checkpoints/storage.py's `extra_state`);
- ZeRO 1/2 ask the host whether the gradient norm is finite before clipping each parameter group
  (`unscale_and_clip_grads`): the same arithmetic, with the check on the device (fp32 and bf16; DeepSpeed's
  own fp16 is left as it is). In bf16, whose overflow check is off (engine.py), a step with a non-finite norm is
  left out by the fused AdamW under DeepSpeed's partitions (`found_inf`), or its gradients zeroed, so it never
  reaches the weights.

What still reads: ZeRO 1/2 in fp32 ask once a step whether the norm is finite, to skip a non-finite step
(in `step()` itself, whose other work is not replaceable piecemeal), ZeRO 3 likewise, and DeepSpeed's own
fp16 (ZeRO 1-3) checks for overflow. No shipped config trains so.
tests/pretrain/test_device_reads.py counts them on CPU.

These are DeepSpeed's private methods and attributes, tested on DeepSpeed 0.19.8 (pyproject.toml pins it). Another
version may rename or rewrite them, and the step would then run DeepSpeed's own host-side parts, or clip twice, or
all-reduce twice, without a word. So `PATCH_TARGETS` names each one with what the patch relies on, and
`check_patch_targets` refuses a DeepSpeed without them, naming its version, before anything is patched. The check
runs when the engine is built (engine.py, before `deepspeed.initialize`), not when this module is imported: importing
DeepSpeed here would choose its accelerator before the launcher's topology has set `DS_ACCELERATOR`, and cost its
5-7 s to commands that only read a checkpoint's loss scaler.
"""

from __future__ import annotations

import importlib
import inspect
import math
import types
from dataclasses import dataclass
from functools import cache, partial
from typing import Any, Protocol

import torch
import torch.distributed as dist

from pipeline.common.errors import PipelineError
from pipeline.pretrain.checkpoints.storage import loss_scaler
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.step.gradient_buckets import GradientBuckets, attach_reducer

TESTED_DEEPSPEED = "0.19.8"
"""The DeepSpeed whose internals the patches below were written for and tested on."""


@dataclass(frozen=True)
class PatchTarget:
    """One DeepSpeed method the step patches, replaces, or relies on, and what of it the patch needs."""

    owner: str
    """The class, as `module:Class`."""
    name: str
    """The method."""
    parameters: tuple[str, ...] | None = None
    """Its parameters, where the patch replaces it (and so must take the same arguments)."""
    names: tuple[str, ...] = ()
    """Attributes and methods its code uses that the patch sets, replaces or reads (DeepSpeed's own spelling)."""
    why: str = ""


PATCH_TARGETS = (
    PatchTarget("deepspeed.runtime.engine:DeepSpeedEngine", "clip_fp32_gradients", parameters=("self",),
                why="ZeRO 0's clipping, replaced by `clip_gradients`"),
    PatchTarget("deepspeed.runtime.engine:DeepSpeedEngine", "_take_model_step",
                names=("clip_fp32_gradients", "torch_autocast_z0_gradscaler"),
                why="calls the clipping and steps fp16 through the GradScaler `grad_scaler` builds"),
    PatchTarget("deepspeed.runtime.engine:DeepSpeedEngine", "_backward_epilogue", names=("enable_backward_allreduce",),
                why="ZeRO 0's all-reduce after the backward, turned off for torch's reducer or for one rank"),
    PatchTarget("deepspeed.runtime.engine:DeepSpeedEngine", "get_global_grad_norm", names=("_global_grad_norm",),
                why="the run log's gradient norm, which `clip_gradients` sets"),
    PatchTarget("deepspeed.runtime.engine:DeepSpeedEngine", "is_gradient_accumulation_boundary", names=("micro_steps",),
                why="whether a micro-step's backward sends its gradients; a hand-over restarts the count it reads "
                    "(`restart_accumulation`)"),
    PatchTarget("deepspeed.runtime.zero.stage_1_and_2:DeepSpeedZeroOptimizer", "unscale_and_clip_grads",
                parameters=("self", "grad_groups_flat", "total_norm"), names=("clip_grad", "loss_scale"),
                why="ZeRO 1/2's clipping, replaced by `unscale_and_clip_grads`"),
)


def target_problems(targets: tuple[PatchTarget, ...] = PATCH_TARGETS) -> list[str]:
    """What of each target the installed DeepSpeed lacks: the class, the method, its parameters, the names its code
    uses (its code object's `co_names`: no source read)."""
    problems = []
    for target in targets:
        module_name, class_name = target.owner.split(":")
        where = f"{class_name}.{target.name}"
        try:
            owner = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            problems.append(f"{target.owner}: missing (needed for {where}: {target.why})")
            continue
        method = inspect.getattr_static(owner, target.name, None)
        if not callable(method):
            problems.append(f"{where}: missing ({target.why})")
            continue
        if target.parameters is not None:
            found = tuple(inspect.signature(method).parameters)
            if found != target.parameters:
                problems.append(f"{where}: takes ({', '.join(found)}), the patch expects "
                                f"({', '.join(target.parameters)}) ({target.why})")
        used = set(getattr(getattr(method, "__code__", None), "co_names", ()))
        if missing := [name for name in target.names if name not in used]:
            problems.append(f"{where}: no longer uses {', '.join(missing)} ({target.why})")
    return problems


@cache
def check_patch_targets() -> None:
    """Refuse a DeepSpeed without the internals the patches need, naming its version and each missing part."""
    from pipeline.common.processes.topology import import_deepspeed

    version = import_deepspeed().__version__
    if problems := target_problems():
        raise PipelineError(
            f"DeepSpeed {version} is installed, but the pipeline patches DeepSpeed internals that it lacks (written "
            f"for and tested on DeepSpeed {TESTED_DEEPSPEED}):\n  " + "\n  ".join(problems)
            + f"\nInstall the tested version: pip install deepspeed=={TESTED_DEEPSPEED} (pyproject.toml pins it).")


DEFAULT_SCALER_KEYS = {"initial_scale_power": 16, "loss_scale_window": 1000}
"""DeepSpeed's fp16 defaults: a first loss scale of 2^16, doubled after 1,000 steps without an overflow."""


class StepJudge(Protocol):
    """What the step asks of the spike guard (pipeline/pretrain/guard/spike_guard.py) inside its clipping: to judge
    the step's gradient norm on the device, and its verdict, a step to leave out, as a device tensor."""

    can_skip: bool
    """Set here: whether a step the guard judges an outlier can be left out inside the optimizer's step."""
    skip: torch.Tensor

    def judge(self, grad_norm: torch.Tensor) -> None: ...


def keep_step_on_device(engine, config: PretrainConfig, guard: StepJudge) -> None:
    """Replace, on this engine, DeepSpeed's host-side parts of the step (the module docstring lists them); at ZeRO 0
    the spike `guard` judges each step in its clipping."""
    check_patch_targets()
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
            engine.gradient_buckets = reduce_with_torch(engine, config)
    elif t.zero_stage in (1, 2) and t.precision != "fp16":  # DeepSpeed's fp16 reads its overflow check anyway
        engine.optimizer.unscale_and_clip_grads = types.MethodType(unscale_and_clip_grads, engine.optimizer)


def reduce_with_torch(engine, config: PretrainConfig) -> GradientBuckets:
    """ZeRO 0 on several ranks: DeepSpeed's all-reduce after the whole backward off, torch's DDP reducer on the
    engine's module in its place (gradient_buckets.py); before each forward, the engine tells it whether the coming
    backward is the accumulation boundary's, the one that sends.

    Not a `DistributedDataParallel` handed to DeepSpeed as the model: the state dict of that wrapper prefixes every
    key with `module.`, so every checkpoint, export and universal checkpoint name would change; `replicate` puts the
    same reducer on the module itself.
    """
    engine.enable_backward_allreduce = False
    buckets = attach_reducer(engine.module, config.train.precision, config.deepspeed)
    forward = engine.forward

    def forward_telling_the_reducer(*args, **kwargs):
        buckets.before_forward(engine.is_gradient_accumulation_boundary())
        return forward(*args, **kwargs)

    engine.forward = forward_telling_the_reducer
    return buckets


def restart_accumulation(engine, accumulation: int) -> None:
    """At a hand-over to another accumulation: the engine decides an accumulation boundary by
    `(micro_steps + 1) % accumulation`, and `micro_steps` counts the whole run, so it restarts at 0 here, as it does
    after a resume, else a new accumulation that does not divide it would end the first step early. ZeRO's
    optimizers keep their own copy of the accumulation (for offloaded gradients), which follows."""
    engine.micro_steps = 0
    if hasattr(engine.optimizer, "gradient_accumulation_steps"):
        engine.optimizer.gradient_accumulation_steps = accumulation


def takes_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's step takes `found_inf` and leaves the whole update out at 1, as GradScaler uses it:
    torch's fused Adam and AdamW, and LAMB and StableAdamW (optimizers.py)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def needs_finite_gradients(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a step it leaves out must still be handed finite gradients: torch's fused kernel skips a left-out
    update whole, and LAMB and StableAdamW zero them themselves; the others compute it and scale it by 0, and NaN × 0
    is NaN."""
    return not (optimizer.defaults.get("fused", False) or getattr(optimizer, "takes_nonfinite_gradients", False))


def clip_gradients(engine, guard: StepJudge, leave_out: torch.Tensor | None) -> None:
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


def loss_scale(engine) -> float | None:
    """The current fp16 loss scale (a device read: for logging steps), None without loss scaling."""
    if (scaler := loss_scaler(engine)) is not None:
        return scaler.get_scale()
    return getattr(engine.optimizer, "cur_scale", None)
