"""The DeepSpeed engine: its config derived from ours, the optimizer and its groups, and the LR scheduler.

LAMB is DeepSpeed's fused `Lamb` on GPU and ours (`Lamb`) on CPU, which DeepSpeed has no build of;
StableAdamW is torch-optimi's (the one ModernBERT trained with) on both. Where DeepSpeed builds none,
the optimizer is passed as a client optimizer, with `zero_allow_untested_optimizer` under ZeRO. Under
ZeRO 1–3 they are given flat partitions, so LAMB's trust ratio and StableAdamW's update clipping are
computed per partition, not per tensor; the pipeline warns so. Which of DeepSpeed's precision paths each
precision takes, and why, is `precision_sections`'s; device_step.py keeps the rest of the step on the device.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import torch

from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.deepspeed_section import offloads_optimizer
from pipeline.pretrain.model.compile_blocks import compile_blocks, compiles
from pipeline.pretrain.model.hf_model import parameter_groups
from pipeline.pretrain.plan.batch_plan import BatchPlan
from pipeline.pretrain.plan.schedules import Schedule
from pipeline.pretrain.step.device_step import keep_step_on_device

MIN_TRUST, MAX_TRUST = 0.01, 10.0
"""DeepSpeed FusedLamb's default `min_coeff` and `max_coeff`."""


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning") for CPU runs, where DeepSpeed's fused
    `Lamb` has no build. The two well-known torch ones were checked here (torch 2.13 CPU) in November 2026:
    - `timm.optim.Lamb` (timm 1.0.31) has the right semantics (bias correction switch, no trust ratio
      where weight decay is 0), but `import timm` needs torchvision, and pip resolves torchvision
      0.29 to a CUDA torch 2.14 that would replace the installed one: too heavy a price for 60 lines.
    - `torch_optimizer.Lamb` (0.3.0, unmaintained since 2021, needs pytorch-ranger) imports, but
      applies the trust ratio to every parameter, biases and LayerNorm included, with no per-group
      switch, and skips bias correction unless `debias=True`.
    So this is written out, as the LAMB paper's Algorithm 2 (and NVIDIA's NVLAMB, timm): Adam moments
    with explicit bias correction, m̂ / (√v̂ + ε), plus decoupled weight decay, scaled per parameter
    tensor by the trust ratio ‖w‖ / ‖update‖ clamped to [`min_trust`, `max_trust`] (DeepSpeed's
    `min_coeff`/`max_coeff`, 0.01 and 10, so both paths clamp alike). Parameter groups with weight
    decay 0 (biases and LayerNorm, `model.parameter_groups`) get no trust ratio: their update is
    Adam's, as in timm and the LAMB paper's BERT setup. One known difference from DeepSpeed's CUDA
    kernel: it folds bias correction into the step size (lr·√(1-β₂ᵗ)/(1-β₁ᵗ)) after the trust ratio,
    so its early steps in the decayed groups are smaller until that factor reaches 1.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, bias_correction: bool = True, min_trust: float = MIN_TRUST,
                 max_trust: float = MAX_TRUST):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
                        min_trust=min_trust, max_trust=max_trust)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._step_group(group, params)
        return loss

    def _step_group(self, group: dict, params: list[torch.Tensor]) -> None:
        """One group's update in multi-tensor (`torch._foreach_*`) operations: a few kernels for the whole group
        instead of a dozen per tensor, and no value read back to the host (the step count is a host int)."""
        if any(p.dtype != torch.float32 for p in params):  # the engine's masters are fp32 at every precision
            raise TypeError("Lamb steps fp32 parameters (master weights); got " +
                            ", ".join(sorted({str(p.dtype) for p in params})))
        beta1, beta2 = group["betas"]
        states = [self.state[p] for p in params]
        for p, state in zip(params, states, strict=True):
            if not state:
                state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            state["step"] += 1
        grads = [p.grad.float() for p in params]
        exp_avgs, exp_avg_sqs = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)  # m ← β₁m + (1-β₁)g
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        step = states[0]["step"]  # the group's tensors step together
        correction1, correction2 = (1 - beta1 ** step, 1 - beta2 ** step) if group["bias_correction"] else (1.0, 1.0)
        denominators = torch._foreach_div(exp_avg_sqs, correction2)
        torch._foreach_sqrt_(denominators)
        torch._foreach_add_(denominators, group["eps"])
        updates = torch._foreach_div(exp_avgs, correction1)
        torch._foreach_div_(updates, denominators)
        if group["weight_decay"]:
            torch._foreach_add_(updates, params, alpha=group["weight_decay"])
            w_norms, u_norms = torch.stack(torch._foreach_norm(params)), torch.stack(torch._foreach_norm(updates))
            # A zero norm (fresh zero-initialised tensor, or no update) leaves the step unscaled.
            trust = torch.where((w_norms > 0) & (u_norms > 0), w_norms / u_norms, torch.ones_like(w_norms))
            torch._foreach_mul_(updates, list(trust.clamp(group["min_trust"], group["max_trust"]).unbind()))
        torch._foreach_add_(params, updates, alpha=-group["lr"])


FLAT_PARTITIONS_CAVEAT = (
    "optimizer.name {name} with {how}: DeepSpeed gives the optimizer flat partitions of the flattened parameter "
    "groups, so {what} is computed per partition, not per {unit}; use {fix} for the per-{unit} {what} of the paper")


def deepspeed_config(config: PretrainConfig, plan: BatchPlan, load_universal: bool = False,
                     cuda: bool = False) -> dict[str, Any]:
    """The user's `deepspeed` section plus what the pipeline derives: batch sizes, precision, optimizer, clipping.

    Without an `optimizer` entry (LAMB on CPU, StableAdamW) DeepSpeed takes the client optimizer instead.
    """
    o, t = config.optimizer, config.train
    ds = copy.deepcopy(config.deepspeed)
    ds["zero_optimization"] = {**ds.get("zero_optimization", {}), "stage": t.zero_stage}
    precision_sections(ds, t.precision, t.zero_stage)
    if load_universal:  # resuming on another world size (pipeline/pretrain/checkpoints/storage.py)
        ds.setdefault("checkpoint", {})["load_universal"] = True
    offload = offloads_optimizer(ds)
    # At ZeRO 0 the spike guard takes the gradient norm where DeepSpeed clips (device_step.py), which it calls only
    # with a clip > 0: an infinite one measures without clipping.
    measure = t.spike_guard != "off" and t.zero_stage == 0
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
        # device_step.py's clipping guard, which matches DeepSpeed's bitwise on CPU) ended at a loss of 5.298
        # where fp32's and the unfused step's ended at 5.105. Not traced; no shipped config trains so.
        native_fp16 = t.precision == "fp16" and t.zero_stage > 0
        fused = {"fused": True} if (o.fused if o.fused is not None else not native_fp16) and not offload else {}
        ds["optimizer"] = {"type": "AdamW", "params": {**common, "torch_adam": not offload, **fused}}
    elif o.name == "lamb" and cuda:
        ds["optimizer"] = {"type": "Lamb", "params": {**common, "bias_correction": True,
                                                      "max_coeff": MAX_TRUST, "min_coeff": MIN_TRUST}}
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
    nothing back to the host (device_step.py keeps the rest of the step on the device).

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


def lr_scheduler(optimizer: torch.optim.Optimizer, schedule: Schedule) -> torch.optim.lr_scheduler.LambdaLR:
    """Each group's base LR × `schedule.multiplier(step)` (schedules.py, the one owner of the LR)."""
    # A function, not the Schedule object: LambdaLR saves a callable object's __dict__ in its state and puts it back
    # on load, which would replace this run's segments with the checkpoint's (an anneal's source, say).
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: schedule.multiplier(step))


def restore_step(scheduler: torch.optim.lr_scheduler.LambdaLR, step: int) -> None:
    """Put a loaded scheduler at optimizer step `step`; its LambdaLR sets each group's LR from the run's schedule.

    A resume restores the step, not the LR the checkpoint's optimizer saved: the two differ for an anneal (the
    source run's schedule saved it) and for a resume with another train.max_steps.
    """
    scheduler.last_epoch = step - 1
    scheduler.step()


def optimizer_groups(model: torch.nn.Module, config: PretrainConfig, cuda: bool) -> list[dict]:
    """`parameter_groups`, plus what DeepSpeed's fused Lamb needs to skip the trust ratio in the no-decay group."""
    groups = parameter_groups(model, config.optimizer.weight_decay)
    if config.optimizer.name == "lamb" and cuda:
        # FusedLamb has no per-group switch for the trust ratio; clamped to [1, 1] it is none.
        groups[1].update(max_coeff=1.0, min_coeff=1.0)
    return groups


def client_optimizer(groups: list[dict], config: PretrainConfig, cuda: bool) -> torch.optim.Optimizer | None:
    """Our LAMB on CPU, torch-optimi's StableAdamW anywhere; None where DeepSpeed builds it from its config."""
    o = config.optimizer
    if o.name == "stableadamw":
        from optimi import StableAdamW

        # foreach off: DeepSpeed hands ZeRO's flat partitions over one by one anyway, and the for-loop is
        # the reference path; kahan_sum off: DeepSpeed keeps fp32 master weights under bf16.
        return StableAdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                           decouple_lr=o.decouple_lr, max_lr=o.lr if o.decouple_lr else None, kahan_sum=False,
                           foreach=False, triton=False)
    if o.name != "lamb" or cuda:
        return None
    return Lamb(groups, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, bias_correction=True)


def initialize_engine(model: torch.nn.Module, config: PretrainConfig, plan: BatchPlan, load_universal: bool = False,
                      *, schedule: Schedule, guard=None):
    """`deepspeed.initialize` with our derived config at `plan`, the batch of the stretch the run starts in
    (`set_batch_plan` changes it later), and `schedule`, the run's LR (the run's plan holds it); the spike `guard`
    (spike_guard.py), when given, judges each step at ZeRO 0 inside it."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    cuda = get_accelerator().device_name() == "cuda"
    optimizer, t = config.optimizer.name, config.train
    how = f"ZeRO stage {t.zero_stage}"
    if optimizer == "lamb" and t.zero_stage > 0:
        warnings.warn(FLAT_PARTITIONS_CAVEAT.format(name=optimizer, how=how, what="trust ratio", unit="layer",
                                                    fix="ZeRO stage 0"), stacklevel=2)
    if optimizer == "stableadamw" and t.zero_stage > 0:
        warnings.warn(FLAT_PARTITIONS_CAVEAT.format(name=optimizer, how=how, what="update clipping", unit="tensor",
                                                    fix="ZeRO stage 0"), stacklevel=2)
    groups = optimizer_groups(model, config, cuda)
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=groups,
        optimizer=client_optimizer(groups, config, cuda),
        lr_scheduler=lambda optimizer: lr_scheduler(optimizer, schedule),
        config=deepspeed_config(config, plan, load_universal, cuda),
    )
    keep_step_on_device(engine, config, guard)
    if compiles(t, cuda):  # preflight.py checks for a compiler first; config.py refuses ZeRO-3
        compile_blocks(engine.module)
    return engine


def set_batch_plan(engine, plan: BatchPlan) -> None:
    """Hand-over: give the engine the next stretch's micro batch and accumulation, keeping weights and moments.

    DeepSpeed's own setters change its batch config; the optimizer and its states are untouched.
    The engine decides an accumulation boundary by `(micro_steps + 1) % accumulation`, and
    `micro_steps` counts the whole run, so it restarts at 0 here, as it does after a resume, else
    a new accumulation that does not divide it would end the first step early. ZeRO's optimizers
    keep their own copy of the accumulation (for offloaded gradients), which follows.
    """
    engine.set_train_micro_batch_size(plan.micro_batch_size)
    engine.set_train_batch_size(plan.global_batch_size)
    assert engine.gradient_accumulation_steps() == plan.accumulation, "DeepSpeed derived another accumulation"
    engine.micro_steps = 0
    if hasattr(engine.optimizer, "gradient_accumulation_steps"):
        engine.optimizer.gradient_accumulation_steps = plan.accumulation
