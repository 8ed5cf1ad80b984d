"""AMPTrainer: bf16 on CPU learns, accumulation equals one big batch, clipping bounds the step."""

from __future__ import annotations

import pytest
import torch

from pipeline.common.errors import PipelineError
from pipeline.kit import AMPTrainer


class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)

    def forward(self, x, labels):
        from types import SimpleNamespace

        return SimpleNamespace(loss=torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels))


def batches(n: int, size: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(8, generator=g)
    out = []
    for _ in range(n):
        x = torch.randn(size, 8, generator=g)
        out.append({"x": x, "labels": x @ w})
    return out


def test_bf16_on_cpu_learns():
    torch.manual_seed(0)
    model = Regressor()
    trainer = AMPTrainer(model, torch.optim.AdamW(model.parameters(), lr=0.05), precision="bf16", device="cpu")
    data = batches(20, 16)
    first = trainer.train_epoch(data)
    for _ in range(5):
        last = trainer.train_epoch(data)
    assert last < first / 5 and trainer.optimizer_steps == 120


def test_accumulation_of_micro_batches_equals_one_large_batch():
    data = batches(4, 8)
    whole = {"x": torch.cat([b["x"] for b in data]), "labels": torch.cat([b["labels"] for b in data])}
    weights = []
    for accumulation, feed in ((4, data), (1, [whole])):
        torch.manual_seed(0)
        model = Regressor()
        trainer = AMPTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), precision="fp32",
                             accumulation_steps=accumulation, max_grad_norm=None, device="cpu")
        for batch in feed:
            trainer.step(batch)
        assert trainer.optimizer_steps == 1
        weights.append(model.linear.weight.detach().clone())
    assert torch.allclose(*weights, atol=1e-6)


def test_clipping_bounds_the_update():
    torch.manual_seed(0)
    model = Regressor()
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    trainer = AMPTrainer(model, torch.optim.SGD(model.parameters(), lr=1.0), precision="bf16", max_grad_norm=0.5,
                         device="cpu")
    trainer.step({"x": torch.randn(4, 8) * 100, "labels": torch.zeros(4)})
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert trainer.last_grad_norm > 0.5  # the norm before clipping
    assert (after - before).norm().item() == pytest.approx(0.5, rel=1e-4)  # SGD at LR 1 moves by the clipped norm


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 with a gradient scaler needs a GPU")
def test_fp16_on_gpu_scales_the_loss():
    model = Regressor()
    trainer = AMPTrainer(model, torch.optim.AdamW(model.parameters(), lr=0.05), precision="fp16", device="cuda")
    trainer.train_epoch(batches(10, 16))
    assert trainer.scaler is not None and trainer.scaler.get_scale() > 1


def test_fp32_after_bf16_in_one_process_gets_its_own_precision():
    """accelerate keeps one precision per process; a second Kit trainer with another is not refused."""
    model = Regressor()
    AMPTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), precision="bf16", device="cpu")
    trainer = AMPTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), precision="fp32", device="cpu")
    assert trainer.accelerator.mixed_precision == "no"
    with trainer.autocast():
        assert trainer.model.linear(torch.randn(2, 8)).dtype == torch.float32


def test_bad_settings_are_clear_errors():
    with pytest.raises(PipelineError, match="fp16 needs a GPU"):
        AMPTrainer(Regressor(), None, precision="fp16", device="cpu")
    with pytest.raises(PipelineError, match="precision must be"):
        AMPTrainer(Regressor(), None, precision="int8")
    with pytest.raises(PipelineError, match="accumulation_steps"):
        AMPTrainer(Regressor(), None, accumulation_steps=0)
