"""bf16 at ZeRO 0 takes the step fp32 takes.

DeepSpeed wraps a torch optimizer at ZeRO 0 in bf16/fp16 (`FP16_UnfusedOptimizer`) and "initialises" its
states with one zero-gradient step, which left AdamW's step counter at 1: the first real update came out
~0.74× fp32's (seen on an H200 as one step ~1e-2 away from fp32, against ~5e-4 at ZeRO 2). The engine
undoes that step; ZeRO 2 never took it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest
import torch
from helpers import ROOT

spec = importlib.util.spec_from_file_location("update_parity", ROOT / "tests" / "dist" / "update_parity.py")
parity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(parity)


@pytest.fixture(scope="module")
def process_group():
    """A world of one for the in-process engines, gone afterwards with the variables it set."""
    import torch.distributed as dist

    saved = dict(os.environ)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from pipeline.common.topology import prepare_environment

    prepare_environment()
    import deepspeed

    assert not dist.is_initialized()
    deepspeed.init_distributed(dist_backend="gloo")
    yield
    dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


def one_step(precision: str, stage: int) -> tuple[dict[str, torch.Tensor], set[int]]:
    """Each weight's change after one engine step from the same start on the same batch; the optimizer's step counts."""
    from pipeline.pretrain.engine import initialize_engine
    from pipeline.pretrain.model import build_model
    from pipeline.pretrain.phases import resolve_phases
    from pipeline.pretrain.schedules import lr_schedule

    config = parity.parity_config(1, stage)
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, precision=precision))
    phases = resolve_phases(config)
    torch.manual_seed(0)
    model = build_model(config.model, parity.tokenizer_info(), parity.SEQ_LEN)
    before = {name: p.detach().float().clone() for name, p in model.named_parameters()}
    engine = initialize_engine(model, config, phases[0].plan(1), schedule=lr_schedule(config, phases))
    engine.train()
    for index in range(parity.ACCUMULATION):
        engine.backward(engine(**parity.micro_batch(0, index))["loss"])
        engine.step()
    counts = {int(state["step"]) for state in engine.basic_optimizer.state.values()}
    return {name: p.detach().float() - before[name] for name, p in engine.module.named_parameters()}, counts


def test_bf16_at_zero_0_and_2_takes_the_step_fp32_takes(process_group):
    reference, counts = one_step("fp32", 0)
    assert counts == {1}
    for stage in (0, 2):
        update, counts = one_step("bf16", stage)
        assert counts == {1}, f"ZeRO {stage}: the optimizer has stepped {counts} times after one step"
        ratios = torch.tensor([(update[n].norm() / reference[n].norm()).item()
                               for n in reference if reference[n].norm() > 0])
        # bf16 rounds each weight (8 bits), which moves single tensors; the median update is fp32's
        assert ratios.median().item() == pytest.approx(1.0, abs=0.02), f"ZeRO {stage}"
