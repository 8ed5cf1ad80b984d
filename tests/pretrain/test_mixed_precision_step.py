"""bf16 and fp16 take the step fp32 takes, on the precision path each ZeRO stage uses (engine.precision_sections).

At ZeRO 0 DeepSpeed is told fp32 and the forward runs under torch.autocast: the module's weights are the fp32
masters and the optimizer steps them once per step (DeepSpeed's own bf16 at ZeRO 0 had wrapped it in
`FP16_UnfusedOptimizer`, which stepped once with zero gradients at the start: the first real update came out
~0.74x fp32's). At ZeRO 2 DeepSpeed's bf16 keeps flat fp32 master partitions. fp16 at ZeRO 0 (autocast and
torch's GradScaler) runs on CPU too; DeepSpeed's own fp16, which ZeRO 1-3 use, does not.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
from helpers import ROOT

spec = importlib.util.spec_from_file_location("update_parity", ROOT / "tests" / "dist" / "update_parity.py")
parity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(parity)


def one_step(precision: str, stage: int) -> tuple[dict[str, torch.Tensor], set[int]]:
    """Each weight's change after one engine step from the same start on the same batch; the optimizer's step counts."""
    from pipeline.models.architectures.hf_model import build_model
    from pipeline.pretrain.guard.spike_guard import SpikeGuard
    from pipeline.pretrain.plan.phases import resolve_phases
    from pipeline.pretrain.plan.schedules import lr_schedule
    from pipeline.pretrain.step.engine import initialize_engine

    config = parity.parity_config(1, stage)
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, precision=precision))
    phases = resolve_phases(config)
    torch.manual_seed(0)
    model = build_model(config.model, parity.tokenizer_info(), parity.SEQ_LEN)
    before = {name: p.detach().float().clone() for name, p in model.named_parameters()}
    engine = initialize_engine(model, config, phases[0].plan(1), schedule=lr_schedule(config, phases),
                               guard=SpikeGuard(config, "cpu", 1))
    engine.train()
    for index in range(parity.ACCUMULATION):
        engine.backward(engine(**parity.micro_batch(0, index))["loss"])
        engine.step()
    counts = {int(state["step"]) for state in engine.basic_optimizer.state.values()}
    return {name: p.detach().float() - before[name] for name, p in engine.module.named_parameters()}, counts


def test_bf16_at_zero_0_and_2_and_fp16_at_zero_0_take_the_step_fp32_takes(process_group):
    reference, counts = one_step("fp32", 0)
    assert counts == {1}
    for precision, stage in (("bf16", 0), ("bf16", 2), ("fp16", 0)):
        update, counts = one_step(precision, stage)
        # fp16: a first step skipped for overflow would leave the fused kernel's count at 0
        assert counts == {1}, f"{precision} ZeRO {stage}: the optimizer has stepped {counts} times after one step"
        ratios = torch.tensor([(update[n].norm() / reference[n].norm()).item()
                               for n in reference if reference[n].norm() > 0])
        # bf16 rounds each weight (8 bits) at ZeRO 2, which moves single tensors; the median update is fp32's
        assert ratios.median().item() == pytest.approx(1.0, abs=0.02), f"{precision} ZeRO {stage}"


def test_zero_0_trains_fp32_masters_under_autocast_and_zero_1_to_3_keep_deepspeeds_bf16():
    from pipeline.pretrain.step.engine import precision_sections

    for precision, dtype in (("bf16", "bfloat16"), ("fp16", "float16")):
        ds = {precision: {"initial_scale_power": 8}} if precision == "fp16" else {}
        precision_sections(ds, precision, 0)
        assert ds["torch_autocast"] == {"enabled": True, "dtype": dtype}
        assert not ds["bf16"]["enabled"] and not ds["fp16"]["enabled"]
        assert ds.get("fp16", {}).get("initial_scale_power", 8) == 8  # the section's further keys stay
    for stage in (1, 2, 3):
        ds = {}
        precision_sections(ds, "bf16", stage)
        # no host-side overflow check: a non-finite loss stops the run at the next check, as in fp32
        assert ds["bf16"] == {"enabled": True, "check_grad_overflow": False} and "torch_autocast" not in ds
        ds = {}
        precision_sections(ds, "fp16", stage)
        assert ds["fp16"] == {"enabled": True, "loss_scale": 0}
    ds = {}
    precision_sections(ds, "fp32", 0)
    assert ds == {"bf16": {"enabled": False}, "fp16": {"enabled": False}}


def test_an_earlier_releases_bf16_checkpoint_at_zero_0_resumes_with_its_fp32_masters_and_moments_and_steps_fused(
        process_group, tmp_path):
    """Its optimizer groups hold `fused: None` (that release's default): the run's own fused kernel must come back,
    or the first step fails where the spike guard's `found_inf` needs it (every ZeRO 0 AdamW step hands it one)."""
    import deepspeed
    from helpers import record_at

    from pipeline.models.architectures.hf_model import build_model
    from pipeline.models.parameter_groups import parameter_groups
    from pipeline.pretrain.checkpoints.record import StartPoint
    from pipeline.pretrain.checkpoints.storage import load_into
    from pipeline.pretrain.guard.spike_guard import SpikeGuard
    from pipeline.pretrain.plan.phases import resolve_phases
    from pipeline.pretrain.plan.schedules import lr_schedule, lr_scheduler
    from pipeline.pretrain.step.engine import deepspeed_config, initialize_engine

    config = parity.parity_config(1, 0)
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, precision="bf16"))
    phases = resolve_phases(config)
    plan, schedule = phases[0].plan(1), lr_schedule(config, phases)
    # The earlier release: DeepSpeed's own bf16 at ZeRO 0, which wraps torch's AdamW in FP16_UnfusedOptimizer.
    ds = deepspeed_config(config, plan)
    ds.pop("torch_autocast")
    ds["bf16"]["enabled"] = True
    ds["optimizer"]["params"].pop("fused")
    torch.manual_seed(0)
    model = build_model(config.model, parity.tokenizer_info(), parity.SEQ_LEN)
    groups = parameter_groups(model, config.optimizer.weight_decay)
    earlier, *_ = deepspeed.initialize(model=model, model_parameters=groups, config=ds,
                                       lr_scheduler=lambda optimizer: lr_scheduler(optimizer, schedule))
    assert type(earlier.optimizer).__name__ == "FP16_UnfusedOptimizer"
    earlier.optimizer.optimizer.state.clear()  # as that release did: DeepSpeed's zero-gradient first step undone
    for index in range(2 * parity.ACCUMULATION):
        earlier.backward(earlier(**parity.micro_batch(index // 2, index % 2))["loss"])
        earlier.step()
    earlier.save_checkpoint(str(tmp_path), tag="step_00000002", save_latest=False)
    masters = [m.clone() for group in earlier.optimizer.fp32_groups for m in group]
    moments = [s["exp_avg"].clone() for s in earlier.optimizer.optimizer.state.values()]

    torch.manual_seed(1)
    engine = initialize_engine(build_model(config.model, parity.tokenizer_info(), parity.SEQ_LEN), config, plan,
                               schedule=schedule, guard=SpikeGuard(config, "cpu", 1))
    earlier_record = record_at(2, zero_stage=0, precision="bf16", version=2)
    load_into(engine, StartPoint(tmp_path / "step_00000002", earlier_record, universal=False), is_main=True)
    params = [p for group in engine.optimizer.param_groups for p in group["params"]]
    assert all(torch.equal(p, m) for p, m in zip(params, masters, strict=True))  # not their bf16 copies
    assert all(p.dtype == torch.float32 for p in params)
    restored = [engine.optimizer.state[p]["exp_avg"] for p in params]
    assert all(torch.equal(a, b) for a, b in zip(restored, moments, strict=True))
    assert {int(engine.optimizer.state[p]["step"]) for p in params} == {2}
    assert all(group["fused"] for group in engine.optimizer.param_groups)
    for index in range(parity.ACCUMULATION):  # a step after the load, through the fused kernel and its found_inf
        engine.backward(engine(**parity.micro_batch(2, index))["loss"])
        engine.step()
    assert {int(engine.optimizer.state[p]["step"]) for p in params} == {3}
    assert not any(torch.equal(p, m) for p, m in zip(params, masters, strict=True))
