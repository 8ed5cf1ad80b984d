"""LAMB and StableAdamW as the step needs them: each group in a few multi-tensor kernels, nothing read back to the
host, and a step left out on the device when `found_inf` says so (engine.py hands them to DeepSpeed as client
optimizers; AdamW is torch's fused one).

Written out rather than taken from a library because each available one reads the host every step:
- StableAdamW: torch-optimi's (0.3, the one ModernBERT trained with) takes `.item()` of its step count and, in its
  multi-tensor form, of every tensor's update RMS. This one computes the same update (the tests hold it to
  torch-optimi's on the same steps) with the step count and the RMS on the device.
- LAMB: DeepSpeed's fused `Lamb` has no CPU build, and under fp16's loss scaler at ZeRO 0 it cannot take
  `found_inf`, so torch's GradScaler reads the host to decide whether to step. `timm.optim.Lamb` (1.0.31) has the
  right semantics but `import timm` needs torchvision, which would replace the installed torch;
  `torch_optimizer.Lamb` (0.3.0, unmaintained) applies the trust ratio to biases and LayerNorm too.
Both advertise `_step_supports_amp_scaling`, as torch's fused AdamW does: GradScaler then hands them `found_inf`
instead of reading it, and the spike guard's verdict reaches them the same way (deepspeed_patches.py). A step left out
changes nothing, at any step count: weights, moments and step count stay, whatever its gradients hold (an fp16
overflow's inf, a NaN: tests/pretrain/test_skipped_updates.py).
"""

from __future__ import annotations

import torch

from pipeline.pretrain.config import PretrainConfig

MIN_TRUST, MAX_TRUST = 0.01, 10.0
"""The trust ratio's clamp (DeepSpeed FusedLamb's default `min_coeff` and `max_coeff`)."""


class DeviceStepOptimizer(torch.optim.Optimizer):
    """An optimizer whose groups step in multi-tensor kernels, leaving the step out at `found_inf`."""

    _step_supports_amp_scaling = True
    takes_nonfinite_gradients = True
    """A step left out may carry non-finite gradients: its caller need not zero them (deepspeed_patches.py)."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf, grad_scale = getattr(self, "found_inf", None), getattr(self, "grad_scale", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if any(p.dtype != torch.float32 for p in params):  # the engine's masters are fp32 at every precision
                raise TypeError(f"{type(self).__name__} steps fp32 parameters (master weights); got " +
                                ", ".join(sorted({str(p.dtype) for p in params})))
            keep = torch.ones((), device=params[0].device) if found_inf is None else 1 - found_inf.to(params[0])
            grads = [p.grad for p in params]
            if grad_scale is not None:  # GradScaler's gradients not yet unscaled
                grads = torch._foreach_div(grads, grad_scale.to(params[0]))
            if found_inf is not None:
                # A step left out is computed and scaled by 0, and NaN × 0 is NaN: its non-finite gradients (an fp16
                # overflow, a NaN nothing zeroed) are zeroed. A kept step's gradients are finite (found_inf says
                # so), and pass unchanged.
                for grad in grads:
                    grad.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
            step = self._step_count(group, params)
            step.add_(keep)
            # A first step left out leaves the count at 0, where the bias corrections 1 - β⁰ are 0 and the update
            # 0 / 0 (NaN, and NaN × 0 is NaN): they are taken at a count of at least 1; the update is scaled by 0.
            self._step_group(group, params, grads, keep, step.clamp(min=1), *self._moments(params))
        return loss

    def _step_group(self, group: dict, params: list[torch.Tensor], grads: list[torch.Tensor], keep: torch.Tensor,
                    step: torch.Tensor, exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor]) -> None:
        """One group's update: `step` already counts this step (unless left out; at least 1), the moments are its
        state."""
        raise NotImplementedError

    def __setstate__(self, state: dict) -> None:
        """A loaded state (`load_state_dict`), whose groups may come from the optimizer an earlier release saved:
        DeepSpeed's FusedLamb named the trust ratio's clamp `max_coeff`/`min_coeff`, torch-optimi's StableAdamW
        kept `beta1`/`beta2`. A setting such a group lacks is this optimizer's (the run's config sets the rest:
        checkpoints/storage.py `own_settings`)."""
        super().__setstate__(state)
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)

    def _step_count(self, group: dict, params: list[torch.Tensor]) -> torch.Tensor:
        """The group's step count, a float tensor on its parameters' device. Earlier releases' checkpoints hold it
        elsewhere: their LAMB and DeepSpeed's FusedLamb per tensor, as a host int; torch-optimi's StableAdamW per
        group, as an int32 tensor."""
        step = group.get("step")
        if step is None:
            step = self.state[params[0]].get("step", 0)
            for p in params:  # the group's count from now on: a per-tensor one left behind would go stale
                self.state[p].pop("step", None)
        if not isinstance(step, torch.Tensor) or step.device != params[0].device or step.dtype != torch.float32:
            step = torch.as_tensor(step, dtype=torch.float32).to(params[0].device)
        group["step"] = step
        return step

    def _moments(self, params: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        states = [self.state[p] for p in params]
        for p, state in zip(params, states, strict=True):
            if "exp_avg" not in state:
                state.update(exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        return [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]


def moving_averages(exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor], grads: list[torch.Tensor],
                    first: torch.Tensor, second: torch.Tensor) -> list[torch.Tensor]:
    """m ← m + first·(g - m), v ← v + second·(g² - v), in place (weights of 0 leave them as they were); returns g²."""
    squares = torch._foreach_mul(grads, grads)
    for averages, targets, weight in ((exp_avgs, grads, first), (exp_avg_sqs, squares, second)):
        moves = torch._foreach_sub(targets, averages)
        torch._foreach_mul_(moves, weight)
        torch._foreach_add_(averages, moves)
    return squares


class Lamb(DeviceStepOptimizer):
    """LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning"), as the paper's Algorithm 2 and NVIDIA's
    NVLAMB: Adam moments with explicit bias correction, m̂ / (√v̂ + ε), plus decoupled weight decay, scaled per
    parameter tensor by the trust ratio ‖w‖ / ‖update‖ clamped to [`min_trust`, `max_trust`]. Parameter groups with
    weight decay 0 (biases and LayerNorm, `model.parameter_groups`) get no trust ratio: their update is Adam's, as in
    timm and the LAMB paper's BERT setup. The step count is a device tensor per group (`step`)."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, bias_correction: bool = True, min_trust: float = MIN_TRUST,
                 max_trust: float = MAX_TRUST):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
                        min_trust=min_trust, max_trust=max_trust)
        super().__init__(params, defaults)

    def _step_group(self, group: dict, params: list[torch.Tensor], grads: list[torch.Tensor], keep: torch.Tensor,
                    step: torch.Tensor, exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor]) -> None:
        beta1, beta2 = group["betas"]
        moving_averages(exp_avgs, exp_avg_sqs, grads, (1 - beta1) * keep, (1 - beta2) * keep)
        if group["bias_correction"]:
            correction1, correction2 = 1 - torch.pow(beta1, step), 1 - torch.pow(beta2, step)
        else:
            correction1 = correction2 = torch.ones((), device=step.device)
        denominators = torch._foreach_div(exp_avg_sqs, correction2)
        torch._foreach_sqrt_(denominators)
        torch._foreach_add_(denominators, group["eps"])
        updates = torch._foreach_div(exp_avgs, correction1)
        torch._foreach_div_(updates, denominators)
        scale = -group["lr"] * keep.expand(len(params))
        if group["weight_decay"]:
            torch._foreach_add_(updates, params, alpha=group["weight_decay"])
            w_norms, u_norms = torch.stack(torch._foreach_norm(params)), torch.stack(torch._foreach_norm(updates))
            # A zero norm (fresh zero-initialised tensor, or no update) leaves the step unscaled.
            trust = torch.where((w_norms > 0) & (u_norms > 0), w_norms / u_norms, torch.ones_like(w_norms))
            scale = scale * trust.clamp(group["min_trust"], group["max_trust"])
        torch._foreach_mul_(updates, list(scale.unbind()))
        torch._foreach_add_(params, updates)


class StableAdamW(DeviceStepOptimizer):
    """StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale vision-language
    models"), as torch-optimi computes it: moving averages with debiased betas, and each tensor's step size divided
    by its update's RMS when that exceeds 1 (AdaFactor's update clipping); weight decay decoupled, or with
    `decouple_lr` fully decoupled from the LR (weight_decay × LR / `max_lr` a step). The step count is a device
    tensor per group (`step`, where torch-optimi keeps it, so its checkpoints load)."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.99), eps: float = 1e-6,
                 weight_decay: float = 1e-2, decouple_lr: bool = False, max_lr: float | None = None):
        if decouple_lr and max_lr is None:
            max_lr = lr
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, decouple_lr=decouple_lr,
                        max_lr=max_lr)
        super().__init__(params, defaults)

    def _step_group(self, group: dict, params: list[torch.Tensor], grads: list[torch.Tensor], keep: torch.Tensor,
                    step: torch.Tensor, exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor]) -> None:
        beta1, beta2 = group["betas"]
        # torch-optimi's debiased beta (β^t - β) / (β^t - 1): its moving averages need no bias correction after
        beta1_hat, beta2_hat = ((torch.pow(b, step) - b) / (torch.pow(b, step) - 1) for b in (beta1, beta2))
        squares = moving_averages(exp_avgs, exp_avg_sqs, grads, (1 - beta1_hat) * keep, (1 - beta2_hat) * keep)
        # Each tensor's update RMS, √mean(g² / max(v, ε²)): a mean of non-negative values is their 1-norm / size.
        torch._foreach_div_(squares, torch._foreach_clamp_min(exp_avg_sqs, group["eps"] ** 2))
        # The sizes go to the kernel as scalar arguments: a tensor of them would be a copy to the device every step.
        means = torch._foreach_norm(squares, 1)
        torch._foreach_div_(means, [float(g.numel()) for g in grads])
        rms = torch.stack(means).sqrt()
        lrs = group["lr"] / rms.clamp(min=1.0) * keep
        if group["weight_decay"]:
            decay = lrs / group["max_lr"] if group["decouple_lr"] else lrs
            torch._foreach_mul_(params, list((1 - decay * group["weight_decay"]).unbind()))
        denominators = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_add_(denominators, group["eps"])
        updates = torch._foreach_div(exp_avgs, denominators)
        torch._foreach_mul_(updates, list((-lrs).unbind()))
        torch._foreach_add_(params, updates)


def client_optimizer(groups: list[dict], config: PretrainConfig) -> torch.optim.Optimizer | None:
    """LAMB or StableAdamW over `groups` (model.parameter_groups: decayed, then not); None for AdamW, which DeepSpeed
    builds from its config."""
    o = config.optimizer
    if o.name == "stableadamw":
        return StableAdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                           decouple_lr=o.decouple_lr, max_lr=o.lr if o.decouple_lr else None)
    if o.name == "lamb":
        return Lamb(groups, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, bias_correction=True)
    return None
