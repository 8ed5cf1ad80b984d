"""LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning") for CPU runs.

On GPU the pipeline uses DeepSpeed's fused Lamb (`"type": "Lamb"`, pipeline/pretrain/engine.py);
it needs a CUDA build, so CPU runs need a torch implementation. The two well-known ones were
checked against this environment (torch 2.13 CPU build) in November 2026:
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
so its early steps in the decayed groups are smaller until that factor reaches 1. Under ZeRO 1–3
the trust ratio's "layer" is one rank's flat partition (engine.py warns so).
"""

from __future__ import annotations

import torch

MIN_TRUST, MAX_TRUST = 0.01, 10.0
"""DeepSpeed FusedLamb's default `min_coeff` and `max_coeff`."""


class Lamb(torch.optim.Optimizer):
    """Layer-wise adaptive moments; one trust ratio per parameter tensor in groups with weight decay."""

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
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.float()
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                if group["bias_correction"]:
                    correction1, correction2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]
                else:
                    correction1 = correction2 = 1.0
                update = (exp_avg / correction1) / (exp_avg_sq / correction2).sqrt().add_(group["eps"])
                weight = p.float()
                if group["weight_decay"]:
                    update.add_(weight, alpha=group["weight_decay"])
                    w_norm, u_norm = weight.norm(), update.norm()
                    # A zero norm (fresh zero-initialised tensor, or no update) leaves the step unscaled.
                    trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                    update.mul_(trust.clamp(group["min_trust"], group["max_trust"]))
                p.add_(update.to(p.dtype), alpha=-group["lr"])
        return loss
