"""The anchors' recipes in configs/recipes/: they keep the anchors' numbers, and their tiny variants train.

The tiny variant is the scale-down documented in docs/recipes.md (the `--set` list is read from that
page, so the documented variant is the tested one), plus the data: the test's shards and tokenizer,
and for a recipe in phases its phases with their names, step shares and LRs kept. One 2-rank launch
trains all six recipes' tiny variants for 24 steps each.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import ROOT

RECIPES = ROOT / "configs" / "recipes"
NAMES = ("modernbert-base", "neobert", "mosaicbert-base", "cramming", "fairseq-roberta-base",
         "nvidia-bert-large-lamb")
DOC = ROOT / "docs" / "recipes.md"


# What the test sets itself, per recipe: its data, and its warmup scaled to the tiny run's steps.
PER_RECIPE = ("data.shards=", "data.tokenizer=", "schedule.warmup_steps=")


def documented_scale_down() -> list[str]:
    """The `--set` values of docs/recipes.md's tiny-variant command, less the per-recipe ones."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    block = next(b for b in blocks if "configs/recipes/" in b and "--set train.max_steps=" in b)
    return [o for o in re.findall(r"--set (\S+)", block) if not o.startswith(PER_RECIPE)]


def tiny_overrides(recipe: Path, shards: Path, tokenizer: Path) -> list[str]:
    """The documented scale-down, the warmup shrunk in proportion, and the test's data."""
    from pipeline.common.config_tree import read_json_config

    overrides = documented_scale_down()
    steps = int(next(o for o in overrides if o.startswith("train.max_steps=")).split("=")[1])
    config = read_json_config(recipe)
    full_steps = config["train"]["max_steps"]

    def scaled(warmup: int) -> int:
        return round(warmup * steps / full_steps)

    if not config.get("phases"):
        return [*overrides, f"schedule.warmup_steps={scaled(config['schedule'].get('warmup_steps', 0))}",
                f"data.shards={shards}", f"data.tokenizer={tokenizer}"]
    batch = next(o for o in overrides if o.startswith("train.global_batch_size=")).split("=")[1]
    micro = next(o for o in overrides if o.startswith("train.micro_batch_size=")).split("=")[1]
    phases = [{**p, "shards": str(shards), "seq_len": None, "global_batch_size": int(batch),
               "micro_batch_size": int(micro),
               "warmup_steps": scaled(p["warmup_steps"])}
              for p in config["phases"]]
    return [*overrides, f"schedule.warmup_steps={scaled(config['schedule'].get('warmup_steps', 0))}",
            f"phases={json.dumps(phases)}", f"data.tokenizer={tokenizer}"]


def recipe_data(name: str, roberta_shards, doc_packed_shards, pairs_shards, bpe, wordpiece) -> tuple[Path, Path]:
    """What each recipe's tiny variant reads: the packing its anchor used, where the test fixtures have it."""
    if name == "nvidia-bert-large-lamb":
        return pairs_shards, wordpiece  # MLM + next-sentence prediction on segment pairs
    if name == "modernbert-base":
        return doc_packed_shards, bpe  # documents packed side by side, attention kept per document
    return roberta_shards, bpe


def test_every_recipe_is_here_and_the_scale_down_is_documented():
    assert sorted(p.stem for p in RECIPES.glob("*.json")) == sorted(NAMES)
    keys = [o.split("=")[0] for o in documented_scale_down()]
    assert {"train.max_steps", "train.global_batch_size", "train.micro_batch_size", "model.hidden_size"} <= set(keys)


@pytest.mark.parametrize("name", NAMES)
def test_the_tiny_variant_of_each_recipe_is_valid_on_two_cpu_ranks(name, tmp_path):
    from pipeline.pretrain.preflight import load_pretrain_config

    overrides = tiny_overrides(RECIPES / f"{name}.json", tmp_path / "shards", tmp_path / "tokenizer")
    config = load_pretrain_config(RECIPES / f"{name}.json", overrides, world_size=2, cuda=False, check_files=False)
    assert config.train.max_steps <= 30 and config.model.hidden_size <= 64
    assert config.train.precision == "fp32"


def test_the_nvidia_recipe_keeps_its_two_phases_steps_batches_and_warmups():
    """DeepLearningExamples' BERT: 7,038 steps of 65,536 × 128 at 6e-3, then 1,563 of 32,768 × 512 at 4e-3."""
    from pipeline.pretrain.phases import resolve_phases
    from pipeline.pretrain.preflight import load_pretrain_config

    config = load_pretrain_config(RECIPES / "nvidia-bert-large-lamb.json", world_size=8, cuda=True,
                                  check_files=False)
    phases = resolve_phases(config)
    assert [(p.steps, p.global_batch_size, p.lr, p.warmup_steps, p.seq_len) for p in phases] == [
        (7038, 65536, 6e-3, 2000, 128), (1563, 32768, 4e-3, 200, 512)]
    # NVIDIA's accumulation on 8 GPUs: 128 in phase 1, 512 in phase 2.
    assert [p.plan(8).accumulation for p in phases] == [128, 512]


def test_the_modernbert_recipe_spends_the_anchors_token_budgets():
    """1.719T tokens at 4,608 × 1,024, then 250B and 50B at 576 × 8,192 (each stage's max_duration)."""
    from pipeline.pretrain.phases import resolve_phases
    from pipeline.pretrain.preflight import load_pretrain_config
    from pipeline.pretrain.schedules import lr_schedule

    config = load_pretrain_config(RECIPES / "modernbert-base.json", world_size=8, cuda=True, check_files=False)
    tokens = [p.steps * p.global_batch_size * p.seq_len for p in resolve_phases(config)]
    for spent, budget in zip(tokens, (1.719e12, 250e9, 50e9), strict=True):
        assert budget - 576 * 8192 < spent <= budget  # whole steps, never past the budget
    assert config.phases[0].warmup_steps * 4608 * 1024 == pytest.approx(3e9, rel=1e-3)  # t_warmup: 3B tokens
    # warmup-stable-decay: only the last stage decays (1 - sqrt, over its whole length, to 0.001 of the peak)
    phases = resolve_phases(config)
    assert [p.decay_steps for p in phases[:2]] == [0, 0] and config.schedule.decay == "1-sqrt"
    lr, peak = lr_schedule(config, phases).multiplier, phases[2].lr / config.optimizer.lr
    assert lr(phases[1].end - 1) == lr(phases[2].start) == peak > lr(phases[2].start + 1)
    assert lr(phases[2].end) == pytest.approx(0.001 * peak)
    assert [p.global_rope_theta for p in phases] == [10_000, 160_000, 160_000]  # the context extension's base


@pytest.mark.slow
def test_each_recipes_tiny_variant_trains_on_two_ranks_and_its_loss_falls(
        tmp_path_factory, roberta_shards, doc_packed_shards, pairs_shards, bpe_tokenizer_dir, wordpiece_tokenizer_dir):
    from test_pretrain_distributed import DEEPSPEED, launch, step_losses

    root = tmp_path_factory.mktemp("recipes")
    plan = {}
    for name in NAMES:
        shards, tokenizer = recipe_data(name, roberta_shards, doc_packed_shards, pairs_shards, bpe_tokenizer_dir,
                                        wordpiece_tokenizer_dir)
        plan[str(RECIPES / f"{name}.json")] = [*tiny_overrides(RECIPES / f"{name}.json", shards, tokenizer),
                                               f"data.cache_dir={root / 'cache' / name}"]
    (root / "plan.json").write_text(json.dumps(plan))
    launch(DEEPSPEED, "tests/dist/train_shipped_recipes.py", root / "plan.json", root / "runs", timeout=900)
    failures = {}
    for name in NAMES:
        losses = step_losses(root / "runs" / name)
        steps = sorted(losses)
        assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 20, (name, steps)
        first, last = [losses[s] for s in steps[:4]], [losses[s] for s in steps[-4:]]
        if not sum(last) / 4 < sum(first) / 4 - 0.1:
            failures[name] = (first, last)
    assert not failures, f"the loss did not fall by 0.1 nats (first 4 steps, last 4): {failures}"
