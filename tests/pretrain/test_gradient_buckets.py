"""ZeRO 0's all-reduce on several ranks is torch's DDP reducer (pipeline/pretrain/step/gradient_buckets.py), sending
as DeepSpeed's keys say: here on a one-process gloo world, where the reducer and its hook run as on several ranks
(tests/pretrain/test_update_parity.py runs two ranks). The config refuses values of those keys it cannot apply.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from helpers import tiny_pretrain_config

from pipeline.common.config.tree import ConfigError
from pipeline.pretrain.preflight import load_pretrain_config
from pipeline.pretrain.step.gradient_buckets import attach_reducer, reduction


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Scaled(torch.nn.Module):
    """y = w · x, and a head that the loss never uses."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))
        self.unused = torch.nn.Linear(4, 1)

    def forward(self, x):
        return {"loss": (self.w * x).sum()}


def reduced_gradient(deepspeed: dict, x: torch.Tensor) -> torch.Tensor:
    module = Scaled()
    buckets = attach_reducer(module, "fp32", deepspeed)
    buckets.before_forward(boundary=True)
    module(x)["loss"].backward()
    assert module.unused.weight.grad is None  # no gradient: AdamW leaves it as it is, as on one rank
    assert buckets.events == [("started", 0)]
    return module.w.grad


def test_fp16_communication_overflows_unless_the_predivide_factor_brings_the_sum_into_range(world_of_one):
    big = torch.tensor([1e5, -1e5, 3.0, 0.5])  # fp16 reaches 65504
    assert torch.equal(reduced_gradient({}, big), big)  # fp32: the mean over one rank is the gradient itself
    overflowed = reduced_gradient({"communication_data_type": "fp16"}, big)
    assert torch.isinf(overflowed[:2]).all()
    predivided = reduced_gradient({"communication_data_type": "FP16", "gradient_predivide_factor": 4.0}, big)
    assert torch.isfinite(predivided).all()
    assert torch.allclose(predivided, big, rtol=1e-3)  # fp16's rounding of 25,000, times 4
    assert not torch.equal(predivided, big)  # it did travel in fp16


def test_the_scaling_is_deepspeeds():
    """DeepSpeed's `allreduce_bucket`: × 1/factor before the sum and × factor/world after it (nothing where that is
    1), or × 1/world before it with `prescale_gradients`; the dtype by precision unless the config names one."""
    plain = reduction("fp32", {}, 4)
    assert (plain.dtype, plain.before, plain.after) == (torch.float32, 1.0, 0.25)
    assert reduction("bf16", {}, 4).dtype == torch.bfloat16
    assert reduction("fp16", {}, 4).dtype == torch.float32  # loss-scaled gradients could overflow fp16
    assert reduction("bf16", {"communication_data_type": "fp32"}, 4).dtype == torch.float32
    factor = reduction("fp32", {"gradient_predivide_factor": 2.0}, 8)
    assert (factor.before, factor.after) == (0.5, 0.25)
    assert reduction("fp32", {"gradient_predivide_factor": 8}, 8).after == 1.0
    prescaled = reduction("fp32", {"prescale_gradients": True}, 8)
    assert (prescaled.before, prescaled.after) == (0.125, 1.0)


class UsedTwice(Scaled):
    """w used once inside a re-entrant activation checkpoint, whose backward is a backward of its own, and once
    outside it: w's gradient is accumulated twice in one backward."""

    def forward(self, x):
        inner = torch.utils.checkpoint.checkpoint(lambda v: (self.w * v).sum(), x, use_reentrant=True)
        return {"loss": inner + (self.w * x).sum()}


def test_a_gradient_made_ready_twice_in_one_backward_stops_the_step(world_of_one):
    """Sent at its first accumulation, the bucket would miss the second half of the gradient; torch's reducer refuses
    it instead."""
    module = UsedTwice()
    attach_reducer(module, "fp32", {}).before_forward(boundary=True)
    loss = module(torch.ones(4, requires_grad=True))["loss"]
    with pytest.raises(RuntimeError, match="marked ready only once|marked as ready twice"):
        loss.backward()


def test_the_communication_keys_are_refused_by_name_when_the_config_loads(tmp_path):
    data = tiny_pretrain_config(tmp_path / "missing-shards", tmp_path / "tok", tmp_path / "out",
                                deepspeed={"communication_data_type": "int8", "gradient_predivide_factor": 0,
                                           "prescale_gradients": "yes"})
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(tmp_path / "config.json", check_files=False)
    problems = err.value.problems
    assert ("deepspeed.communication_data_type: expected one of fp32, bf16, fp16 (what gradients travel in between "
            "ranks), got 'int8'") in problems
    assert any(p.startswith("deepspeed.gradient_predivide_factor: expected a positive number") and p.endswith("got 0")
               for p in problems)
    assert "deepspeed.prescale_gradients: expected true or false, got 'yes'" in problems
    data["deepspeed"] = {"prescale_gradients": True, "gradient_predivide_factor": 2.0}
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(tmp_path / "config.json", check_files=False)
    assert any(p.startswith("deepspeed.gradient_predivide_factor: not applied with deepspeed.prescale_gradients true")
               for p in err.value.problems)
    data["deepspeed"] = {"communication_data_type": "bf16", "gradient_predivide_factor": 2.0}
    (tmp_path / "config.json").write_text(json.dumps(data))
    load_pretrain_config(tmp_path / "config.json", check_files=False)
