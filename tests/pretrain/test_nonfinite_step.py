"""A non-finite gradient never reaches the weights, at every ZeRO stage and optimizer the shipped configs train with,
and the spike guard counts only the step that had it (a NaN update would make every later step an outlier).

bf16 at ZeRO 1 and 2 runs without DeepSpeed's host-side overflow check (engine.precision_sections), and ZeRO 0
hands every optimizer step to torch: deepspeed_patches.py leaves such a step out inside fused AdamW (`found_inf`), or
zeroes its gradients for the optimizers without that switch (LAMB, StableAdamW).
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

NAN_AT = 2
SHIPPED = [("fp32", 0, "adamw"), ("bf16", 0, "adamw"), ("bf16", 0, "lamb"), ("bf16", 1, "adamw"),
           ("bf16", 1, "stableadamw"), ("bf16", 2, "adamw")]
"""(precision, ZeRO stage, optimizer) as configs/ ship them (bf16 on GPUs; fp32 is the CPU configs')."""


@pytest.mark.parametrize(("precision", "stage", "optimizer"), SHIPPED,
                         ids=[f"{p}-zero{s}-{o}" for p, s, o in SHIPPED])
def test_a_nan_loss_never_reaches_the_weights_and_only_its_step_is_an_outlier(process_group, precision, stage,
                                                                               optimizer):
    from pipeline.models.architectures.hf_model import build_model
    from pipeline.pretrain.config import GuardConfig
    from pipeline.pretrain.guard.spike_guard import SpikeGuard
    from pipeline.pretrain.plan.phases import resolve_phases
    from pipeline.pretrain.plan.schedules import lr_schedule
    from pipeline.pretrain.step.engine import initialize_engine

    config = parity.parity_config(1, stage)
    config = dataclasses.replace(
        config, optimizer=dataclasses.replace(config.optimizer, name=optimizer),
        train=dataclasses.replace(config.train, precision=precision, spike_guard="rollback"),
        guard=GuardConfig(window=4, min_steps=2))
    phases = resolve_phases(config)
    torch.manual_seed(0)
    guard = SpikeGuard(config, "cpu", world_size=1)
    engine = initialize_engine(build_model(config.model, parity.tokenizer_info(), parity.SEQ_LEN), config,
                               phases[0].plan(1), schedule=lr_schedule(config, phases), guard=guard)
    engine.train()
    for step in range(1, 5):
        losses = []
        for index in range(parity.ACCUMULATION):
            loss = engine(**parity.micro_batch(step, index))["loss"] * (float("nan") if step == NAN_AT else 1.0)
            engine.backward(loss)
            losses.append(loss.detach().float())
            if index == parity.ACCUMULATION - 1:
                guard.loss(step, losses)
            engine.step()
        guard.after_update(engine)
        weights = [p for group in engine.optimizer.param_groups for p in group["params"]]
        assert all(torch.isfinite(p).all() for p in weights), f"step {step}: a non-finite value reached the weights"
    spike = guard.verdict(guard.readout().tolist(), 4)
    assert (spike.count, spike.nonfinite, spike.since) == (1, 1, (NAN_AT,))
