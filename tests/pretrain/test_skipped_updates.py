"""A step left out changes nothing, at any step count, for every optimizer the pipeline steps: torch's fused AdamW
(which DeepSpeed builds for `optimizer.name adamw`), and our LAMB and StableAdamW (step/optimizers.py).

A step is left out in three ways, and each reaches the optimizer as `found_inf`:
- the non-finite check or the spike guard (deepspeed_patches.py) set it, the gradients finite (a spike) or not (a NaN
  that nothing zeroed: clipping off);
- fp16's loss scaler (torch's GradScaler, which ZeRO 0 uses) finds an overflow: the gradients are still scaled and
  hold an inf, unscaled first (clipping on) or handed over with the scale (clipping off).
Each case leaves out the first step (the step count still 0: the bias correction must not divide 0 by 0), the
second, and a later one, and holds the weights, both moments and the step count bit-equal to before; the next steps
then match, bit for bit, a run that never saw the left-out gradients. The optimizers step fp32 master weights at
every precision (bf16 and fp16 train through them under autocast at ZeRO 0); the engine's own paths, bf16 and ZeRO 1-2
included, are test_nonfinite_step.py's.
"""

from __future__ import annotations

import pytest
import torch

from pipeline.pretrain.step.optimizers import Lamb, StableAdamW

STEPS = 6
SKIPPED = (1, 2, 4)
"""Steps (1-based) left out, one at a time: the first, the second, and one after updates were taken."""


def fused_adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01, fused=True)


def lamb(params):
    return Lamb(params, lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)


def stableadamw(params):
    return StableAdamW(params, lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)


OPTIMIZERS = {"fused-adamw": fused_adamw, "lamb": lamb, "stableadamw": stableadamw}
HOW = ("spike", "nan-gradient", "fp16-overflow-unscaled", "fp16-overflow-scaled")
"""How the step is left out: the guard's verdict on finite gradients ×1e4; the non-finite check's on NaN gradients;
GradScaler's overflow, with the gradients unscaled first (as DeepSpeed does before clipping) or handed over scaled."""


def model() -> list[torch.nn.Parameter]:
    """A decayed matrix and an undecayed bias, as `parameter_groups` splits them (LAMB's trust ratio is in one)."""
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(6, 5)), torch.nn.Parameter(torch.randn(5))]


def groups(params: list[torch.nn.Parameter]) -> list[dict]:
    return [{"params": params[:1], "weight_decay": 0.01}, {"params": params[1:], "weight_decay": 0.0}]


def gradients(step: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    return [torch.randn(6, 5, generator=generator), torch.randn(5, generator=generator)]


def state(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Copies of the weights, both moments of each and its step count (AdamW's per tensor, ours per group), a state
    not yet made counting as zeros (each optimizer makes it at its first step, taken or not)."""
    held = [p.detach().clone() for p in params]
    for group in optimizer.param_groups:
        for p in group["params"]:
            s = optimizer.state[p]
            held += [s[k].clone() if k in s else torch.zeros_like(p) for k in ("exp_avg", "exp_avg_sq")]
            held.append(torch.as_tensor(s.get("step", group.get("step", 0)), dtype=torch.float32).clone())
    return held


def step(optimizer, params, grads, *, left_out: str | None, scaler: torch.amp.GradScaler | None) -> None:
    """One step on `grads`; `left_out` names how the step is left out (HOW), None for a kept step."""
    if left_out == "spike":
        grads = [g * 1e4 for g in grads]
    elif left_out == "nan-gradient" or (left_out or "").startswith("fp16"):
        grads = [g.clone() for g in grads]
        grads[0][0, 0] = float("nan") if left_out == "nan-gradient" else float("inf")
    if scaler is None:
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        optimizer.found_inf = torch.tensor(float(left_out is not None))  # the guard's or the check's verdict
        optimizer.step()
        return
    for p, g in zip(params, grads, strict=True):
        p.grad = scaler.scale(g)
    if left_out == "fp16-overflow-unscaled":
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()


def train(make, left_out: tuple[int, str] | None, steps=range(1, STEPS + 1), scaled: bool = False):
    """The weights and states after each of `steps`; `left_out` (step, how) leaves one out."""
    params = model()
    optimizer = make(groups(params))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 4, growth_interval=1000) if scaled else None
    after = {0: state(optimizer, params)}
    for n in steps:
        how = left_out[1] if left_out is not None and left_out[0] == n else None
        step(optimizer, params, gradients(n), left_out=how, scaler=scaler)
        after[n] = state(optimizer, params)
    return after


def differences(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[str]:
    return [f"tensor {i}: {x.flatten()[:3].tolist()} -> {y.flatten()[:3].tolist()}"
            for i, (x, y) in enumerate(zip(a, b, strict=True)) if not torch.equal(x, y)]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("skipped", SKIPPED, ids=[f"step{s}" for s in SKIPPED])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_step_left_out_changes_no_weight_moment_or_step_count(name, skipped, how):
    scaled = how.startswith("fp16")
    after = train(OPTIMIZERS[name], (skipped, how), scaled=scaled)
    changed = differences(after[skipped - 1], after[skipped])
    assert not changed, f"{name}: step {skipped} left out ({how}) changed {changed}"
    assert all(torch.isfinite(t).all() for t in after[STEPS]), f"{name}: a non-finite value after step {skipped}"
    # What follows is the run without that step's gradients: the step count was not moved either.
    kept = [n for n in range(1, STEPS + 1) if n != skipped]
    without = train(OPTIMIZERS[name], None, steps=kept, scaled=scaled)
    assert not differences(after[STEPS], without[STEPS]), f"{name}: the steps after {skipped} differ from a run " \
                                                          "that never had it"


@pytest.mark.parametrize("name", ["lamb", "stableadamw"])
def test_a_fresh_optimizer_whose_first_step_is_left_out_keeps_its_weights_finite(name):
    """The shortest form of the first step's case: zero gradients, `found_inf` 1, a fresh optimizer."""
    w = torch.nn.Parameter(torch.randn(4, 4))
    before = w.detach().clone()
    optimizer = OPTIMIZERS[name]([w])
    w.grad, optimizer.found_inf = torch.zeros_like(w), torch.tensor(1.0)
    optimizer.step()
    assert torch.equal(w.detach(), before), f"{name}: {w.detach()[0].tolist()} after a left-out first step"
