"""LAMB: Adam with bias correction where there is no weight decay, a per-tensor trust ratio where there is."""

from __future__ import annotations

import pytest
import torch

from pipeline.pretrain.step.optimizers import MAX_TRUST, Lamb


def run_steps(optimizer_cls, weight: torch.Tensor, grads: list[torch.Tensor], **kwargs) -> torch.Tensor:
    param = torch.nn.Parameter(weight.clone())
    optimizer = optimizer_cls([param], **kwargs)
    for grad in grads:
        param.grad = grad.clone()
        optimizer.step()
    return param.detach()


def test_without_weight_decay_the_step_is_adams_with_bias_correction():
    torch.manual_seed(0)
    weight, grads = torch.randn(8, 4), [torch.randn(8, 4) for _ in range(5)]
    ours = run_steps(Lamb, weight, grads, lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)
    adam = run_steps(torch.optim.Adam, weight, grads, lr=1e-2, betas=(0.9, 0.999), eps=1e-6)
    assert torch.allclose(ours, adam, atol=1e-6)


def test_with_weight_decay_the_step_is_the_trust_ratio_times_the_adam_update():
    torch.manual_seed(1)
    weight, grad = torch.randn(16, 16), torch.randn(16, 16)
    lr, wd, eps = 1e-2, 0.01, 1e-6
    after = run_steps(Lamb, weight, [grad], lr=lr, weight_decay=wd, eps=eps)
    # First step with bias correction: m̂ = g, v̂ = g², so the Adam direction is g / (|g| + ε).
    update = grad / (grad.abs() + eps) + wd * weight
    trust = weight.norm() / update.norm()
    assert torch.allclose(after, weight - lr * trust * update, atol=1e-6)
    # Without bias correction the first step points elsewhere (m = 0.1 g, v = 0.001 g²).
    uncorrected = run_steps(Lamb, weight, [grad], lr=lr, weight_decay=wd, eps=eps, bias_correction=False)
    assert not torch.allclose(after, uncorrected, atol=1e-4)


def test_the_step_scales_with_the_layers_weight_norm_up_to_the_clamp():
    """What makes LAMB work at large batches: each layer moves by a fraction of its own norm."""
    torch.manual_seed(2)
    weight, grad = torch.randn(32, 32), torch.randn(32, 32)
    for scale in (1.0, 3.0):
        w = weight * scale
        moved = (run_steps(Lamb, w, [grad], lr=1e-3, weight_decay=0.01) - w).norm()
        assert moved.item() == pytest.approx(1e-3 * w.norm().item(), rel=1e-4)
    tiny = weight * 1e-9  # ‖w‖ / ‖update‖ below the lower clamp: the step is 0.01 × ‖update‖
    moved = (run_steps(Lamb, tiny, [grad], lr=1.0, weight_decay=0.01) - tiny).norm()
    assert moved.item() == pytest.approx(0.01 * (grad / (grad.abs() + 1e-6)).norm().item(), rel=1e-3)
    assert MAX_TRUST == 10.0


def test_state_round_trips_through_state_dict():
    torch.manual_seed(3)
    weight, grads = torch.randn(4, 4), [torch.randn(4, 4) for _ in range(4)]
    straight = run_steps(Lamb, weight, grads, lr=1e-2, weight_decay=0.01)
    param = torch.nn.Parameter(weight.clone())
    first = Lamb([param], lr=1e-2, weight_decay=0.01)
    for grad in grads[:2]:
        param.grad = grad.clone()
        first.step()
    second = Lamb([param], lr=1e-2, weight_decay=0.01)
    second.load_state_dict(first.state_dict())
    for grad in grads[2:]:
        param.grad = grad.clone()
        second.step()
    assert torch.equal(param.detach(), straight)
