"""Today's encoder recipes in a real run: WSD with a stable phase, StableAdamW under ZeRO 0–2, validation at its
own masking rate, and a ModernBERT context-extension phase that raises the RoPE theta, resumed exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_pretrain_config
from test_phases import phased_config, short_shards  # noqa: F401 (a fixture)
from test_pretrain_distributed import launch, step_losses, write_config

from pipeline.common.run_layout import PretrainLayout

RESUME_STEP = 7  # inside the second phase: the resumed run must rebuild the raised theta


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in PretrainLayout(run).metrics.read_text().splitlines()]


@pytest.fixture(scope="module")
def recipe_runs(tmp_path_factory, roberta_shards, short_shards, bpe_tokenizer_dir):  # noqa: F811
    root = tmp_path_factory.mktemp("recipe")
    common = {"data": {"num_workers": 1, "cache_dir": str(root / "cache")}}
    phased = phased_config(
        root, short_shards, roberta_shards, bpe_tokenizer_dir, **common,
        model={"architecture": "modernbert", "num_hidden_layers": 3, "intermediate_size": 96, "local_attention": 16,
               "global_rope_theta": 10_000.0},
        masking={"probability": 0.3, "eval_probability": 0.15},
        optimizer={"name": "stableadamw", "lr": 2e-3},
        schedule={"kind": "wsd", "decay": "1-sqrt", "decay_steps": 2, "warmup_steps": 2},
        train={"eval_every": 4}, checkpoint={"every": 1, "keep_last": 8})
    phased["phases"][0]["decay_steps"] = 0  # the stable phase; the context extension decays
    phased["phases"][1].update(warmup_steps=0, global_rope_theta=160_000.0)
    flat = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, root / "unused", **common,
                                optimizer={"name": "stableadamw", "lr": 2e-3}, train={"export": False},
                                checkpoint={"every": 8, "keep_last": 1})
    out = launch([], "tests/dist/train_schedules_and_stableadamw.py", write_config(root / "phased.json", phased),
                 write_config(root / "flat.json", flat), root, RESUME_STEP, timeout=900)
    return root, out


@pytest.mark.slow
def test_the_wsd_lr_is_its_formula_at_every_step_and_after_a_resume(recipe_runs):
    root, _ = recipe_runs
    full, resumed = (root / "phased" / "full", root / "phased" / "resumed")
    lrs = {r["step"]: r["train/lr"] for r in records(full) if "train/lr" in r}
    # Phase 1 (6 steps, peak 2e-3): warmup (s + 1)/3, then stable; phase 2 (peak 1e-3): 1-sqrt over its 2 steps.
    expected = [2e-3 / 3, 4e-3 / 3, 2e-3, 2e-3, 2e-3, 2e-3, 1e-3, 1e-3 * (1 - math.sqrt(0.5))]
    assert [lrs[s] for s in range(1, 9)] == pytest.approx(expected, rel=1e-12)
    after = {r["step"]: r["train/lr"] for r in records(resumed) if "train/lr" in r}
    assert after == {8: lrs[8]}
    assert step_losses(resumed) == {8: step_losses(full)[8]}  # same theta, batches, masks and moments: exact


@pytest.mark.slow
def test_the_context_extension_phase_raises_the_theta_and_the_export_records_it(recipe_runs):
    from transformers import AutoModelForMaskedLM

    root, _ = recipe_runs
    saved = PretrainLayout(root / "phased" / "full").checkpoints
    theta = {s: json.loads((saved / f"step_{s:08d}" / "complete.json").read_text())["hf_config"]["rope_parameters"]
             for s in (6, 7)}
    assert theta[6]["full_attention"]["rope_theta"] == 10_000.0  # phase 1 trained the step
    assert theta[7]["full_attention"]["rope_theta"] == 160_000.0 and theta[7]["sliding_attention"]["rope_theta"] == \
        10_000.0
    export = PretrainLayout(root / "phased" / "full").export
    assert json.loads((export / "config.json").read_text())["rope_parameters"]["full_attention"]["rope_theta"] == \
        160_000.0
    model = AutoModelForMaskedLM.from_pretrained(export)
    dim = model.config.hidden_size // model.config.num_attention_heads
    expected = 1.0 / (160_000.0 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    assert torch.allclose(model.model.rotary_emb.full_attention_inv_freq, expected)
    states = {name: torch.load(PretrainLayout(root / "phased" / name).checkpoints / "step_00000008" /
                               "mp_rank_00_model_states.pt", weights_only=False)["module"]
              for name in ("full", "resumed")}
    assert all(torch.equal(states["full"][k], v) for k, v in states["resumed"].items())


@pytest.mark.slow
def test_validation_runs_at_its_own_masking_rate_and_every_loss_names_it(recipe_runs):
    root, out = recipe_runs
    evaluations = [r for r in records(root / "phased" / "full") if "eval/mlm_loss" in r]
    assert [r["step"] for r in evaluations] == [4, 8]
    assert all(r["eval/mask_rate"] == 0.15 for r in evaluations)
    assert "eval MLM loss at 15% masking" in out
    config = json.loads(PretrainLayout(root / "phased" / "full").config.read_text())
    assert (config["masking"]["probability"], config["masking"]["eval_probability"]) == (0.3, 0.15)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_stableadamw_trains_under_each_zero_stage(recipe_runs, stage):
    root, _ = recipe_runs
    losses = step_losses(root / f"zero{stage}")
    assert sorted(losses) == list(range(1, 9)) and all(np.isfinite(list(losses.values())))
    assert losses[8] < losses[1] - 0.1
