"""The DeepSpeed engine: its config derived from ours, AdamW groups, and the warmup-then-decay schedule."""

from __future__ import annotations

import copy
from typing import Any

import torch

from pipeline.pretrain.batch_plan import BatchPlan
from pipeline.pretrain.config import PretrainConfig, ScheduleConfig
from pipeline.pretrain.model import parameter_groups


def deepspeed_config(config: PretrainConfig, plan: BatchPlan, load_universal: bool = False) -> dict[str, Any]:
    """The user's `deepspeed` section plus what the pipeline derives: batch sizes, optimizer, clipping."""
    ds = copy.deepcopy(config.deepspeed)
    if load_universal:  # resuming on another world size (pipeline/pretrain/universal_resume.py)
        ds.setdefault("checkpoint", {})["load_universal"] = True
    offload = ds.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none") not in ("none", None)
    o = config.optimizer
    ds.update(
        train_batch_size=plan.global_batch_size,
        train_micro_batch_size_per_gpu=plan.micro_batch_size,
        gradient_accumulation_steps=plan.accumulation,
        gradient_clipping=config.train.gradient_clipping,
        optimizer={"type": "AdamW", "params": {
            "lr": o.lr, "betas": list(o.betas), "eps": o.eps, "weight_decay": o.weight_decay,
            # torch's AdamW needs no compiled extension; offloaded states need DeepSpeed's CPU Adam.
            "torch_adam": not offload,
        }},
    )
    if ds.get("fp16", {}).get("enabled"):
        ds["fp16"].setdefault("loss_scale", 0)  # 0 = dynamic loss scaling
    ds.setdefault("steps_per_print", 10**9)  # the pipeline logs itself
    ds.setdefault("wall_clock_breakdown", False)
    return ds


def lr_multiplier(step: int, schedule: ScheduleConfig, max_steps: int) -> float:
    """LR at optimizer step `step` (0-based) as a fraction of the peak: linear warmup, then decay.

    Warmup starts at 1/(warmup+1) of the peak rather than 0 so no step is wasted at LR 0
    (DeepSpeed's WarmupDecayLR spends its first two steps there).
    """
    if step < schedule.warmup_steps:
        return (step + 1) / (schedule.warmup_steps + 1)
    if schedule.decay == "constant":
        return 1.0
    remaining = max(0.0, 1.0 - (step - schedule.warmup_steps) / max(1, max_steps - schedule.warmup_steps))
    power = 1.0 if schedule.decay == "linear" else schedule.power
    return schedule.end_lr_ratio + (1.0 - schedule.end_lr_ratio) * remaining**power


def initialize_engine(model: torch.nn.Module, config: PretrainConfig, plan: BatchPlan, load_universal: bool = False):
    """`deepspeed.initialize` with our derived config; returns the engine."""
    import deepspeed

    def make_scheduler(optimizer):
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_multiplier(step, config.schedule, config.train.max_steps))

    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=parameter_groups(model, config.optimizer.weight_decay),
        lr_scheduler=make_scheduler,
        config=deepspeed_config(config, plan, load_universal),
    )
    return engine
