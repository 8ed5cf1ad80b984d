"""The DeepSpeed engine: its config derived from ours, the optimizer and its groups, and the LR scheduler.

AdamW is torch's fused one, which DeepSpeed builds from its config; LAMB and StableAdamW are ours
(optimizers.py: multi-tensor, no host read), passed as client optimizers, with
`zero_allow_untested_optimizer` under ZeRO. Under
ZeRO 1–3 they are given flat partitions, so LAMB's trust ratio and StableAdamW's update clipping are
computed per partition, not per tensor; the pipeline warns so. Which of DeepSpeed's precision paths each
precision takes, and why, is `precision_sections`'s; deepspeed_patches.py keeps the rest of the step on the device.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import torch

from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.models.parameter_groups import parameter_groups
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.deepspeed_keys import offloads_optimizer
from pipeline.pretrain.plan.schedules import Schedule, lr_scheduler
from pipeline.pretrain.step.compile_blocks import compile_blocks, compiles
from pipeline.pretrain.step.deepspeed_patches import (
    StepJudge,
    check_patch_targets,
    keep_step_on_device,
    restart_accumulation,
)
from pipeline.pretrain.step.optimizers import client_optimizer

FLAT_PARTITIONS_CAVEAT = (
    "optimizer.name {name} with {how}: DeepSpeed gives the optimizer flat partitions of the flattened parameter "
    "groups, so {what} is computed per partition, not per {unit}; use {fix} for the per-{unit} {what} of the paper")


def deepspeed_config(config: PretrainConfig, plan: BatchPlan, load_universal: bool = False) -> dict[str, Any]:
    """The user's `deepspeed` section plus what the pipeline derives: batch sizes, precision, optimizer, clipping.

    Without an `optimizer` entry (LAMB, StableAdamW: optimizers.py) DeepSpeed takes the client optimizer instead.
    """
    o, t = config.optimizer, config.train
    ds = copy.deepcopy(config.deepspeed)
    ds["zero_optimization"] = {**ds.get("zero_optimization", {}), "stage": t.zero_stage}
    precision_sections(ds, t.precision, t.zero_stage)
    if load_universal:  # resuming on another world size (pipeline/pretrain/checkpoints/storage.py)
        ds.setdefault("checkpoint", {})["load_universal"] = True
    offload = offloads_optimizer(ds)
    # At ZeRO 0 the step's non-finite check and the spike guard take the gradient norm where DeepSpeed clips
    # (deepspeed_patches.py), which it calls only with a clip > 0: an infinite one measures without clipping, so that
    # a non-finite step is left out with clipping off too.
    measure = t.zero_stage == 0
    ds.update(
        train_batch_size=plan.global_batch_size,
        train_micro_batch_size_per_gpu=plan.micro_batch_size,
        gradient_accumulation_steps=plan.accumulation,
        gradient_clipping=t.gradient_clipping or (math.inf if measure else 0.0),
    )
    common = {"lr": o.lr, "betas": list(o.betas), "eps": o.eps, "weight_decay": o.weight_decay}
    if o.name == "adamw":
        # torch's AdamW needs no compiled extension; offloaded states need DeepSpeed's CPU Adam.
        # DeepSpeed passes the remaining params to torch.optim.AdamW, `fused` included. Under DeepSpeed's own fp16
        # (ZeRO 1-3) the fused kernel is used only when asked for: one step of it there on an H100 (ZeRO 2, with
        # deepspeed_patches.py's clipping guard, which matches DeepSpeed's bitwise on CPU) ended at a loss of 5.298
        # where fp32's and the unfused step's ended at 5.105. Not traced; no shipped config trains so.
        native_fp16 = t.precision == "fp16" and t.zero_stage > 0
        fused = {"fused": True} if (o.fused if o.fused is not None else not native_fp16) and not offload else {}
        ds["optimizer"] = {"type": "AdamW", "params": {**common, "torch_adam": not offload, **fused}}
    if o.name in ("lamb", "stableadamw") and t.zero_stage > 0:
        ds.setdefault("zero_allow_untested_optimizer", True)
    # Its throughput timer synchronises the device at every forward and every step; the pipeline times steps itself.
    ds.setdefault("timers", {"throughput": {"enabled": False}})
    ds.setdefault("steps_per_print", 10**9)  # the pipeline logs itself
    ds.setdefault("wall_clock_breakdown", False)
    return ds


AUTOCAST_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def precision_sections(ds: dict[str, Any], precision: str, zero_stage: int) -> None:
    """DeepSpeed's `bf16`, `fp16` and `torch_autocast` sections for `precision`, chosen so that a step reads
    nothing back to the host (deepspeed_patches.py keeps the rest of the step on the device).

    Chosen by measurement (CPU, a 24-layer, 32-wide RoBERTa with RoBERTa-large's 394 tensors; per bf16 step):
    - ZeRO 0: DeepSpeed's own bf16/fp16 wraps a torch optimizer in `FP16_UnfusedOptimizer` (fp32 copies, norms
      and a `bool()` overflow check per tensor): 22,118 operator calls and a device read per tensor, where a
      plain loop takes 8,256 and none. So DeepSpeed is told fp32 and the forward runs under `torch.autocast`
      (its `torch_autocast` section): the module's weights are the fp32 masters, torch's fused AdamW steps them,
      and fp16 scales the loss with torch's GradScaler, whose skip of an overflowing step happens inside the
      fused kernel (`found_inf`): 8,254 calls, no read.
    - ZeRO 1-3 keep flat fp32 master partitions themselves. DeepSpeed's bf16 there took 15,357 calls and no
      read once its host-side overflow check is off (as fp32 has none: a non-finite loss stops the run at the
      next check, cadence.py); autocast took 17,027 and a read (DeepSpeed's finite-norm check on fp32 weights);
      `data_types.grad_accum_dtype: fp32` (ZeRO 1 only) 12,157 and two reads it has no switch for. fp16 keeps
      DeepSpeed's dynamic loss scaling (its overflow check reads the host: fp16 at ZeRO 1-3 is no shipped config).
    """
    autocast = zero_stage == 0 and precision in AUTOCAST_DTYPES
    for name in ("bf16", "fp16"):  # train.precision owns `enabled`; the section keeps DeepSpeed's further keys
        ds[name] = {**ds.get(name, {}), "enabled": precision == name and not autocast}
    if autocast:
        ds["torch_autocast"] = {"enabled": True, "dtype": AUTOCAST_DTYPES[precision]}
    elif precision == "bf16":
        ds["bf16"].setdefault("check_grad_overflow", False)
    elif precision == "fp16":
        ds["fp16"].setdefault("loss_scale", 0)  # 0 = dynamic loss scaling


def initialize_engine(model: torch.nn.Module, config: PretrainConfig, plan: BatchPlan, load_universal: bool = False,
                      *, schedule: Schedule, guard: StepJudge):
    """`deepspeed.initialize` with our derived config at `plan`, the batch of the stretch the run starts in
    (`set_batch_plan` changes it later), and `schedule`, the run's LR (the run's plan holds it); the spike `guard`
    (guard/spike_guard.py) judges each step at ZeRO 0 inside it."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    check_patch_targets()  # a DeepSpeed without the internals the step patches is refused before it builds anything
    cuda = get_accelerator().device_name() == "cuda"
    optimizer, t = config.optimizer.name, config.train
    how = f"ZeRO stage {t.zero_stage}"
    if optimizer == "lamb" and t.zero_stage > 0:
        warnings.warn(FLAT_PARTITIONS_CAVEAT.format(name=optimizer, how=how, what="trust ratio", unit="layer",
                                                    fix="ZeRO stage 0"), stacklevel=2)
    if optimizer == "stableadamw" and t.zero_stage > 0:
        warnings.warn(FLAT_PARTITIONS_CAVEAT.format(name=optimizer, how=how, what="update clipping", unit="tensor",
                                                    fix="ZeRO stage 0"), stacklevel=2)
    derived = deepspeed_config(config, plan, load_universal)
    groups = parameter_groups(model, config.optimizer.weight_decay)
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=groups,
        optimizer=client_optimizer(groups, config),
        lr_scheduler=lambda optimizer: lr_scheduler(optimizer, schedule),
        config=derived,
    )
    keep_step_on_device(engine, config, guard)
    if compiles(t, cuda):  # preflight.py checks for a compiler first; config.py refuses ZeRO-3
        compile_blocks(engine.module)
    return engine


def set_batch_plan(engine, plan: BatchPlan) -> None:
    """Hand-over: give the engine the next stretch's micro batch and accumulation, keeping weights and moments.

    DeepSpeed's own setters change its batch config; the optimizer and its states are untouched; its count of
    micro-steps restarts (`restart_accumulation`).
    """
    engine.set_train_micro_batch_size(plan.micro_batch_size)
    engine.set_train_batch_size(plan.global_batch_size)
    assert engine.gradient_accumulation_steps() == plan.accumulation, "DeepSpeed derived another accumulation"
    restart_accumulation(engine, plan.accumulation)
