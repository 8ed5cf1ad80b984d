"""The optimizers DeepSpeed does not build from its config, handed to it as client optimizers: our LAMB on CPU,
where DeepSpeed's fused `Lamb` has no build, and torch-optimi's StableAdamW anywhere (engine.py)."""

from __future__ import annotations

import torch

from pipeline.pretrain.config import PretrainConfig

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


def client_optimizer(groups: list[dict], config: PretrainConfig, cuda: bool) -> torch.optim.Optimizer | None:
    """Our LAMB on CPU, torch-optimi's StableAdamW anywhere; None where DeepSpeed builds it from its config. Also
    what DeepSpeed's fused Lamb needs of the `groups` (model.parameter_groups: decayed, then not) to skip the trust
    ratio in the no-decay group."""
    o = config.optimizer
    if o.name == "lamb" and cuda:
        # FusedLamb has no per-group switch for the trust ratio; clamped to [1, 1] it is none.
        groups[1].update(max_coeff=1.0, min_coeff=1.0)
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
