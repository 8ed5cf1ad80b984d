"""A non-finite gradient never reaches the weights, at every ZeRO stage and optimizer the shipped configs train with,
and the spike guard counts only the step that had it (a NaN update would make every later step an outlier).

bf16 at ZeRO 1 and 2 runs without DeepSpeed's host-side overflow check (engine.precision_sections), and ZeRO 0
hands every optimizer step to torch: deepspeed_patches.py leaves such a step out inside the optimizer (`found_inf`:
fused AdamW, LAMB, StableAdamW), with clipping on or off, at the first step as at any other: weights and moments stay
bit-equal (the optimizers' own cases: test_skipped_updates.py).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json

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


LEFT_OUT = (1, 2, 4)
"""Steps whose loss is NaN: the first (the step count still 0), the second (still 0), and one after a taken step."""
ENGINES = [(o, p, s, c) for o in ("adamw", "lamb", "stableadamw") for p in ("fp32", "bf16", "fp16") for s in (0, 1, 2)
           for c in (0.0, 1.0) if p != "fp16" or s == 0]
"""fp16 at ZeRO 0 only: torch's GradScaler and autocast run on CPU, DeepSpeed's own fp16 (ZeRO 1-2) does not."""


def optimizer_tensors(engine) -> list[torch.Tensor]:
    """Copies of the tensors the step moves: the master weights (ZeRO 1-2: the flat fp32 partitions), each state
    tensor of the optimizer that steps them (moments, AdamW's step counters) and our optimizers' group step counts."""
    inner = engine.optimizer
    while hasattr(inner, "optimizer") and isinstance(inner.optimizer, torch.optim.Optimizer):
        inner = inner.optimizer  # DeepSpeed's ZeRO wrapper around the torch optimizer
    params = [p for group in inner.param_groups for p in group["params"]]
    held = [p.detach().clone() for p in params]
    held += [v.clone() for p in params for _, v in sorted(inner.state[p].items()) if isinstance(v, torch.Tensor)]
    return held + [torch.as_tensor(g["step"]).clone() for g in inner.param_groups if "step" in g]


@pytest.mark.parametrize(("optimizer", "precision", "stage", "clipping"), ENGINES,
                         ids=[f"{o}-{p}-zero{s}-clip{c:g}" for o, p, s, c in ENGINES])
def test_a_nonfinite_step_leaves_weights_and_moments_bit_equal_at_any_step_count(process_group, optimizer,
                                                                                  precision, stage, clipping):
    """The engine's own paths (guard off): ZeRO 0's non-finite check in its clipping, which runs with clipping off
    too, and in fp16 the loss scaler's overflow; at ZeRO 1-2 DeepSpeed's host-side check (fp32) or ours on the device
    (bf16). A NaN loss at steps 1, 2 and 4: each leaves every master weight and optimizer state as it was, and step 3
    and 5 still train."""
    from pipeline.models.architectures.hf_model import build_model
    from pipeline.pretrain.guard.spike_guard import SpikeGuard
    from pipeline.pretrain.plan.phases import resolve_phases
    from pipeline.pretrain.plan.schedules import lr_schedule
    from pipeline.pretrain.step.engine import initialize_engine

    config = parity.parity_config(1, stage)
    config = dataclasses.replace(
        config, optimizer=dataclasses.replace(config.optimizer, name=optimizer),
        train=dataclasses.replace(config.train, precision=precision, gradient_clipping=clipping))
    phases = resolve_phases(config)
    torch.manual_seed(0)
    engine = initialize_engine(build_model(config.model, parity.tokenizer_info(), parity.SEQ_LEN), config,
                               phases[0].plan(1), schedule=lr_schedule(config, phases),
                               guard=SpikeGuard(config, "cpu", world_size=1))
    engine.train()
    weights = len(optimizer_tensors(engine))  # a fresh optimizer holds no state yet: the weights alone
    before = optimizer_tensors(engine)
    for step in range(1, 6):
        for index in range(parity.ACCUMULATION):
            loss = engine(**parity.micro_batch(step, index))["loss"]
            engine.backward(loss * (float("nan") if step in LEFT_OUT else 1.0))
            engine.step()
        after = optimizer_tensors(engine)
        if step in LEFT_OUT:
            # At the first step the states are made, taken or not: they must hold what a fresh one would, zeros.
            expected = before + [torch.zeros_like(t) for t in after[len(before):]] if len(before) == weights else before
            changed = [i for i, (a, b) in enumerate(zip(expected, after, strict=True)) if not torch.equal(a, b)]
            assert not changed, f"step {step} left out: tensors {changed} of {len(after)} changed"
        else:
            assert not torch.equal(before[0], after[0]), f"step {step} was not taken"
        before = after
    assert all(torch.isfinite(t).all() for t in after)


@pytest.mark.slow
def test_on_two_ranks_a_nan_on_one_rank_leaves_every_ranks_weights_and_moments_as_they_were(tmp_path):
    """One launch (tests/dist/skipped_steps.py): a NaN loss on rank 1 alone at steps 1 and 3, for AdamW, LAMB and
    StableAdamW at ZeRO 0 (clipping off, the buckets' all-reduce) and ZeRO 1-2: on both ranks the left-out steps
    change nothing, the others train, and the ranks end with the same weights."""
    from test_pretrain_distributed import DEEPSPEED, launch

    launch(DEEPSPEED, "tests/dist/skipped_steps.py", tmp_path, timeout=600)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0].keys() == ranks[1].keys() and len(ranks[0]) == 6
    for case in ranks[0]:
        for rank, notes in enumerate(ranks):
            unchanged = {int(step): same for step, same in notes[case]["unchanged"].items()}
            assert unchanged == {1: True, 2: False, 3: True, 4: False}, f"{case}, rank {rank}: {unchanged}"
            assert notes[case]["finite"], f"{case}, rank {rank}: a non-finite weight or state"
        assert ranks[0][case]["weights"] == ranks[1][case]["weights"], f"{case}: the ranks' weights differ"
