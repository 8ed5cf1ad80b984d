"""A checkpoint written by the previous release resumes and steps, with each optimizer that release shipped: torch's
fused AdamW, its own CPU LAMB (a host-int step count per tensor), DeepSpeed's FusedLamb (its GPU LAMB: groups with
`max_coeff`/`min_coeff`, no `min_trust`) and torch-optimi's StableAdamW (an int32 step count per group, `beta1` and
`beta2` for `betas`). Today's LAMB and StableAdamW (step/optimizers.py) keep another state, so a checkpoint they
write carries a newer record version, which that release refuses by name.

The fixtures are that release's own checkpoints (fixtures/previous_release/make_fixtures.py says how they were
written), each resumed here through `Pretrainer.train` from its step 2 to step 4.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "previous_release"
spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
make_fixtures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_fixtures)

SAVED_AT, RESUMED_TO = 2, 4
OPTIMIZERS = ("adamw", "lamb", "lamb-fused", "stableadamw", "stableadamw-zero1")
"""`stableadamw-zero1`: bf16 at ZeRO 1, as that release's StableAdamW recipes trained (DeepSpeed's partitions)."""


def saved_optimizer(name: str) -> dict:
    path = FIXTURES / name / "checkpoints" / f"step_{SAVED_AT:08d}" / "mp_rank_00_model_states.pt"
    return torch.load(path, map_location="cpu", weights_only=False)["optimizer"]


def test_the_fixtures_hold_each_optimizers_own_state():
    """What makes each fixture the case it stands for (a fixture regenerated otherwise would test nothing)."""
    groups = {name: saved_optimizer(name)["param_groups"] for name in OPTIMIZERS if "zero" not in name}
    assert {"max_coeff", "min_coeff"} <= groups["lamb-fused"][0].keys() and "min_trust" not in groups["lamb-fused"][0]
    assert isinstance(saved_optimizer("lamb")["state"][0]["step"], int) and "step" not in groups["lamb"][0]
    assert groups["stableadamw"][0]["step"].dtype == torch.int32 and "beta1" in groups["stableadamw"][0]
    assert groups["adamw"][0]["fused"] is True


def test_the_record_version_is_newer_than_that_releases():
    """LAMB's and StableAdamW's saved state changed since (a step count per group, on the device): that release
    reads records up to its own version and refuses newer ones by name, rather than failing inside its optimizer."""
    from pipeline.pretrain.checkpoints.record import RECORD_VERSION, read_record

    versions = {read_record(FIXTURES / name / "checkpoints" / f"step_{SAVED_AT:08d}").version for name in OPTIMIZERS}
    assert max(versions) < RECORD_VERSION, f"that release wrote record version {versions}, today's is {RECORD_VERSION}"


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_previous_release_checkpoint_resumes_and_steps(tmp_path, process_group, name):
    import pipeline.pretrain.trainer as trainer_module
    from pipeline.common.processes.topology import current_topology
    from pipeline.pretrain.checkpoints.record import RECORD_VERSION, read_record
    from pipeline.pretrain.checkpoints.storage import newest_complete
    from pipeline.pretrain.preflight import prepare_run

    data = tmp_path / "data"
    for part in ("shards", "tokenizer"):
        shutil.copytree(FIXTURES / part, data / part)
    config = make_fixtures.config(data, tmp_path, name)
    config["train"]["max_steps"] = RESUMED_TO
    shutil.copytree(FIXTURES / name / "checkpoints", tmp_path / name / "checkpoints")
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    trainer = trainer_module.Pretrainer(prepare_run(path, world_size=1), current_topology())
    trainer.train()

    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    assert any(str(r.get("resumed_from", "")).endswith(f"step_{SAVED_AT:08d}") for r in records), records[:3]
    losses = {r["step"]: r["train/loss"] for r in records if "train/loss" in r}
    assert sorted(losses) == list(range(SAVED_AT + 1, RESUMED_TO + 1)) and all(map(math.isfinite, losses.values()))
    weights = [p for group in trainer.engine.optimizer.param_groups for p in group["params"]]
    assert all(torch.isfinite(w).all() for w in weights), f"{name}: a non-finite weight after the resume"
    newest = newest_complete(tmp_path / name / "checkpoints")
    assert read_record(newest).version == RECORD_VERSION
    # The step count went on from the checkpoint's (a fresh optimizer would be at 2): its state was taken up.
    optimizer = trainer.engine.optimizer
    counts = {float(group["step"]) for group in optimizer.param_groups if "step" in group} or {
        float(optimizer.state[p]["step"]) for group in optimizer.param_groups for p in group["params"]}
    assert counts == {float(RESUMED_TO)}, f"{name}: step counts {counts} after resuming at {SAVED_AT}"
