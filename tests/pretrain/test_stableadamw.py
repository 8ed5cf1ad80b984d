"""StableAdamW as `optimizer.name stableadamw` (step/optimizers.py): its update clipping and weight decay against the
definition on hand-computed cases, the same steps as torch-optimi's (the reference ModernBERT trained with), a step
left out at `found_inf`, and how the pipeline hands it to DeepSpeed.

The definition (Wortsman et al. 2023, "Stable and low-precision training", Algorithm 2): Adam's
bias-corrected moments m̂, v̂; per tensor RMS = √mean(g² / v̂); the step's LR is lr / max(1, RMS); weights
decay by lr_t·λ (or by (lr_t / peak)·λ when fully decoupled) before the Adam update −lr_t · m̂ / (√v̂ + ε).
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import tiny_pretrain_config
from test_phases import load

from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.pretrain.step.engine import deepspeed_config
from pipeline.pretrain.step.optimizers import client_optimizer

EPS = 1e-8


def stableadamw(tmp_path, params: list[torch.nn.Parameter], weight_decay: float, lr: float = 0.1, **optimizer):
    data = tiny_pretrain_config("shards", "tok", tmp_path / "out",
                                optimizer={"name": "stableadamw", "lr": lr, "betas": [0.9, 0.99], "eps": EPS,
                                           "weight_decay": weight_decay, **optimizer})
    config = load(tmp_path, data, check_files=False)
    return client_optimizer([{"params": params, "weight_decay": weight_decay}], config)


def two_steps(optimizer, param, grads):
    for g in grads:
        param.grad = torch.full_like(param, g)
        optimizer.step()
    return param.detach().clone()


def test_a_gradient_spike_divides_the_step_by_its_update_rms(tmp_path):
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    after = two_steps(stableadamw(tmp_path, [p], weight_decay=0.1), p, [1.0, 4.0])
    # Step 1: m̂ = g = 1, v̂ = g² = 1, RMS = 1: lr_1 = 0.1; decay ×(1 − 0.1·0.1), then −0.1 · 1/(1 + ε).
    w = torch.tensor([1.0, -2.0]) * (1 - 0.1 * 0.1) - 0.1 * 1 / (1 + EPS)
    # Step 2, g = 4: m̂ = (0.9·0.1 + 0.1·4)/(1 − 0.9²) = 0.49/0.19, v̂ = (0.99·0.01 + 0.01·16)/(1 − 0.99²).
    m_hat, v_hat = 0.49 / 0.19, 0.1699 / 0.0199
    rms = math.sqrt(16 / v_hat)  # = 1.369: the spike is clipped
    assert rms > 1
    lr_2 = 0.1 / rms
    expected = w * (1 - lr_2 * 0.1) - lr_2 * m_hat / (math.sqrt(v_hat) + EPS)
    assert torch.allclose(after, expected, rtol=0, atol=1e-6)
    # AdamW's step (no clipping) would land elsewhere by more than the tolerance.
    adamw = w * (1 - 0.1 * 0.1) - 0.1 * m_hat / (math.sqrt(v_hat) + EPS)
    assert (adamw - after).abs().min() > 1e-3


def test_a_calm_gradient_takes_adamws_step_and_clipping_is_per_tensor(tmp_path):
    calm, spiky = torch.nn.Parameter(torch.tensor([0.5, 0.5])), torch.nn.Parameter(torch.tensor([0.5, 0.5]))
    optimizer = stableadamw(tmp_path, [calm, spiky], weight_decay=0.0)
    for g_calm, g_spiky in ((1.0, 1.0), (0.5, 4.0)):
        calm.grad, spiky.grad = torch.full((2,), g_calm), torch.full((2,), g_spiky)
        optimizer.step()
    # calm, step 2: v̂ = (0.0099 + 0.0025)/0.0199, RMS = √(0.25 / v̂) = 0.63 < 1: the full lr 0.1.
    m_hat, v_hat = (0.09 + 0.05) / 0.19, (0.0099 + 0.0025) / 0.0199
    assert math.sqrt(0.25 / v_hat) < 1
    expected = 0.5 - 0.1 / (1 + EPS) - 0.1 * m_hat / (math.sqrt(v_hat) + EPS)
    assert torch.allclose(calm.detach(), torch.full((2,), expected), rtol=0, atol=1e-6)
    # spiky, in the same step and group, is clipped by its own RMS (1.369), as in the first test.
    spiky_step = 0.1 / math.sqrt(16 / (0.1699 / 0.0199)) * (0.49 / 0.19) / (math.sqrt(0.1699 / 0.0199) + EPS)
    assert torch.allclose(spiky.detach(), torch.full((2,), 0.5 - 0.1 / (1 + EPS) - spiky_step), rtol=0, atol=1e-6)


def test_weight_decay_is_decoupled_and_fully_decoupled_follows_the_schedule_not_the_lr(tmp_path):
    zero_grad = [0.0]  # m̂ = v̂ = 0: the Adam update is 0, only the decay moves the weight
    coupled = torch.nn.Parameter(torch.tensor([2.0]))
    two_steps(stableadamw(tmp_path, [coupled], weight_decay=0.5, lr=0.1), coupled, zero_grad)
    assert coupled.item() == pytest.approx(2.0 * (1 - 0.1 * 0.5))  # AdamW's: lr · λ, not added to the gradient
    full = torch.nn.Parameter(torch.tensor([2.0]))
    optimizer = stableadamw(tmp_path, [full], weight_decay=1e-4, lr=0.1, decouple_lr=True)
    optimizer.param_groups[0]["lr"] = 0.05  # the schedule at half the peak (optimizer.lr 0.1)
    two_steps(optimizer, full, zero_grad)
    assert full.item() == pytest.approx(2.0 * (1 - 0.5 * 1e-4), abs=1e-7)  # (lr_t / peak) · λ, not lr_t · λ


@pytest.mark.parametrize("decouple_lr", [False, True])
def test_its_steps_are_torch_optimis_with_nothing_read_back_and_a_step_left_out_changes_nothing(tmp_path,
                                                                                                 decouple_lr):
    from optimi import StableAdamW as Reference

    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    optimizer = stableadamw(tmp_path, ours, weight_decay=0.1, lr=1e-2, decouple_lr=decouple_lr)
    reference = Reference([{"params": theirs, "weight_decay": 0.1}], lr=1e-2, betas=(0.9, 0.99), eps=EPS,
                          decouple_lr=decouple_lr, max_lr=1e-2 if decouple_lr else None, kahan_sum=False,
                          foreach=False, triton=False)
    for step in range(12):
        grads = [torch.randn_like(p) * (30 if step == 6 else 1) for p in ours]  # step 6's update is clipped
        for p, q, g in zip(ours, theirs, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        optimizer.step()
        reference.step()
    assert max(float((p - q).abs().max()) for p, q in zip(ours, theirs, strict=True)) < 1e-6
    before = [p.detach().clone() for p in ours] + [s["exp_avg_sq"].clone() for s in optimizer.state.values()]
    step = optimizer.param_groups[0]["step"].clone()
    optimizer.found_inf = torch.tensor(1.0)  # as torch's GradScaler or the spike guard hands it over
    for p in ours:
        p.grad = torch.randn_like(p)
    optimizer.step()
    after = [p.detach() for p in ours] + [s["exp_avg_sq"] for s in optimizer.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert torch.equal(step, optimizer.param_groups[0]["step"])


def test_deepspeed_gets_it_as_a_client_optimizer_allowed_under_zero(tmp_path):
    data = tiny_pretrain_config("shards", "tok", tmp_path / "out", optimizer={"name": "stableadamw"},
                                train={"zero_stage": 2})
    config = load(tmp_path, data, check_files=False, world_size=2)
    ds = deepspeed_config(config, BatchPlan.derive(16, 4, 2))
    assert "optimizer" not in ds and ds["zero_allow_untested_optimizer"] is True


def test_stableadamw_settings_are_checked_up_front(tmp_path):
    from pipeline.common.config.tree import ConfigError

    data = tiny_pretrain_config("shards", "tok", tmp_path / "out", optimizer={"decouple_lr": True},
                                train={"zero_stage": 1},
                                deepspeed={"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})
    data["optimizer"]["name"] = "adamw"
    with pytest.raises(ConfigError, match="optimizer.decouple_lr: only for optimizer.name stableadamw"):
        load(tmp_path, data, check_files=False)
    data["optimizer"] = {"name": "stableadamw"}
    with pytest.raises(ConfigError, match="optimizer.name stableadamw with deepspeed.zero_optimization.offload"):
        load(tmp_path, data, check_files=False)
