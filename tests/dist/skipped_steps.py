"""Test harness: on 2 ranks, a NaN loss on rank 1 alone at steps 1 and 3 leaves both ranks' weights and optimizer
states as they were, for each shipped optimizer across ZeRO stages, and the ranks end with equal weights.

    deepspeed --num_gpus 2 tests/dist/skipped_steps.py OUT

At ZeRO 0 the bucketed all-reduce spreads rank 1's NaN to rank 0's gradients, and each rank's non-finite check leaves
the step out (clipping off: DeepSpeed is told an infinite clip); at ZeRO 1-2 the all-reduced norm does, under
DeepSpeed's partitions. Step 1 is left out with the step count still 0. Each rank writes `rank<r>.json`:
{case: {"unchanged": {step: bool}, "finite": bool, "weights": digest of the module's weights}}.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from update_parity import ACCUMULATION, micro_batch, parity_config, tokenizer_info  # noqa: E402

CASES = [("adamw", "bf16", 0, 0.0), ("lamb", "bf16", 0, 0.0), ("stableadamw", "bf16", 0, 0.0),
         ("lamb", "bf16", 2, 1.0), ("stableadamw", "bf16", 1, 1.0), ("adamw", "fp32", 2, 1.0)]
"""(optimizer, precision, ZeRO stage, gradient clipping)."""
NAN_AT, STEPS = (1, 3), 4


def optimizer_tensors(engine) -> list[torch.Tensor]:
    """Copies of the master weights and every state tensor of the torch optimizer that steps them, with our
    optimizers' group step counts; a state not yet made counts as zeros of its weight's shape."""
    inner = engine.optimizer
    while hasattr(inner, "optimizer") and isinstance(inner.optimizer, torch.optim.Optimizer):
        inner = inner.optimizer
    held = []
    for group in inner.param_groups:
        for p in group["params"]:
            state = inner.state[p]
            held += [p.detach().clone(), *(state[k].clone() if k in state else torch.zeros_like(p)
                                           for k in ("exp_avg", "exp_avg_sq"))]
            held.append(torch.as_tensor(state.get("step", group.get("step", 0)), dtype=torch.float32).clone())
    return held


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--local_rank", type=int, default=None)
    args = p.parse_args()
    from pipeline.common.processes.topology import prepare_environment

    topology = prepare_environment()
    from pipeline.models.architectures.hf_model import build_model
    from pipeline.pretrain.plan.phases import resolve_phases
    from pipeline.pretrain.plan.schedules import lr_schedule
    from pipeline.pretrain.step.engine import initialize_engine
    from pipeline.pretrain.guard.spike_guard import SpikeGuard

    notes = {}
    for optimizer, precision, stage, clipping in CASES:
        config = parity_config(topology.world_size, stage)
        config = dataclasses.replace(
            config, optimizer=dataclasses.replace(config.optimizer, name=optimizer),
            train=dataclasses.replace(config.train, precision=precision, gradient_clipping=clipping))
        phases = resolve_phases(config)
        plan = phases[0].plan(topology.world_size)
        torch.manual_seed(0)
        engine = initialize_engine(build_model(config.model, tokenizer_info(), 32), config, plan,
                                   schedule=lr_schedule(config, phases),
                                   guard=SpikeGuard(config, "cpu", topology.world_size))
        engine.train()
        unchanged, before = {}, optimizer_tensors(engine)
        for step in range(1, STEPS + 1):
            for micro in range(ACCUMULATION):
                loss = engine(**micro_batch(step, plan.micro_batch_index(topology.rank, micro)))["loss"]
                planted = step in NAN_AT and topology.rank == 1
                engine.backward(loss * (float("nan") if planted else 1.0))
                engine.step()
            after = optimizer_tensors(engine)
            unchanged[step] = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
            before = after
        weights = torch.cat([t.detach().float().flatten() for t in engine.module.state_dict().values()])
        notes[f"{optimizer}-{precision}-zero{stage}-clip{clipping:g}"] = {
            "unchanged": unchanged, "finite": bool(all(torch.isfinite(t).all() for t in before)),
            "weights": hashlib.sha256(weights.numpy().tobytes()).hexdigest()}
        del engine
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{topology.rank}.json").write_text(json.dumps(notes))


if __name__ == "__main__":
    main()
