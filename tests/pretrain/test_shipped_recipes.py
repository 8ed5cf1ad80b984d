"""The anchors' recipes in configs/recipes/: they keep the anchors' numbers, and their tiny variants train.

The tiny variant is the scale-down documented in docs/recipes.md (the `--set` list is read from that
page, so the documented variant is the tested one), plus the data: the test's shards and tokenizer,
for a recipe in phases its phases with their names, step shares, LRs, masking rates and sampling
temperatures kept (a phase that mixes corpora gets two folders of the test corpus), and for an anneal
the tiny run of its source recipe. One 2-rank launch trains every recipe's tiny variant, in order.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import ROOT

RECIPES = ROOT / "configs" / "recipes"
NAMES = ("modernbert-base", "neobert", "mosaicbert-base", "cramming", "fairseq-roberta-base",
         "nvidia-bert-large-lamb", "mmbert-base", "ettin-encoder-base", "ettin-encoder-base-decay")
ANNEALS = {"ettin-encoder-base-decay": "ettin-encoder-base"}
"""The recipes that decay from a checkpoint of another (`train.anneal_from`), and that other recipe."""
TINY_STEP_FRACTIONS = {"mmbert-base": [0.5, 0.25, 0.25]}
"""Recipes whose phases' own shares leave a phase without a whole step of the tiny run (docs/recipes.md)."""
DOC = ROOT / "docs" / "recipes.md"


# What the test sets itself, per recipe: its data, and its warmup scaled to the tiny run's steps.
PER_RECIPE = ("data.shards=", "data.tokenizer=", "schedule.warmup_steps=")


def documented_scale_down() -> list[str]:
    """The `--set` values of docs/recipes.md's tiny-variant command, less the per-recipe ones."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    block = next(b for b in blocks if "configs/recipes/" in b and "--set train.max_steps=" in b)
    return [o for o in re.findall(r"--set (\S+)", block) if not o.startswith(PER_RECIPE)]


def tiny_overrides(recipe: Path, shards: list[Path], tokenizer: Path, anneal_from: Path | None = None) -> list[str]:
    """The documented scale-down, the warmup shrunk in proportion, and the test's data: the first of `shards` for a
    run or a phase on one folder, all of them for a phase that mixes corpora; an anneal decays from `anneal_from`
    for as many steps as the scaled-down run has."""
    from pipeline.common.config.tree import read_json_config

    overrides = documented_scale_down()
    steps = int(next(o for o in overrides if o.startswith("train.max_steps=")).split("=")[1])
    config = read_json_config(recipe)
    full_steps = config["train"]["max_steps"]

    def scaled(warmup: int) -> int:
        return round(warmup * steps / full_steps)

    overrides.append(f"schedule.warmup_steps={scaled(config['schedule'].get('warmup_steps', 0))}")
    if config["train"].get("anneal_from"):
        overrides += [f"train.anneal_from={json.dumps(str(anneal_from))}", f"train.anneal_steps={steps}"]
    if not config.get("phases"):
        return [*overrides, f"data.shards={shards[0]}", f"data.tokenizer={tokenizer}"]
    batch = next(o for o in overrides if o.startswith("train.global_batch_size=")).split("=")[1]
    micro = next(o for o in overrides if o.startswith("train.micro_batch_size=")).split("=")[1]
    fractions = TINY_STEP_FRACTIONS.get(recipe.stem, [p["steps_fraction"] for p in config["phases"]])
    phases = [{**p, "shards": [{"path": str(s)} for s in shards] if isinstance(p["shards"], list) else str(shards[0]),
               "steps_fraction": fraction, "seq_len": None, "global_batch_size": int(batch),
               "micro_batch_size": int(micro), "warmup_steps": scaled(p["warmup_steps"])}
              for p, fraction in zip(config["phases"], fractions, strict=True)]
    return [*overrides, f"phases={json.dumps(phases)}", f"data.tokenizer={tokenizer}"]


def recipe_data(name: str, roberta_shards, doc_packed_shards, other_doc_packed_shards, pairs_shards, bpe,
                wordpiece) -> tuple[list[Path], Path]:
    """What each recipe's tiny variant reads: the packing its anchor used, where the test fixtures have it, and a
    second corpus for a mix of corpora or an anneal on other data."""
    if name == "nvidia-bert-large-lamb":
        return [pairs_shards], wordpiece  # MLM + next-sentence prediction on segment pairs
    if name in ANNEALS:
        return [other_doc_packed_shards], bpe  # the decay's own data, another folder than its source's
    if name in ("modernbert-base", "mmbert-base", "ettin-encoder-base"):
        # documents side by side (Ettin pads one per row: the fixtures have no `doc` folder; the model is the same)
        return [doc_packed_shards, other_doc_packed_shards], bpe
    return [roberta_shards], bpe


@pytest.fixture(scope="module")
def other_doc_packed_shards(tmp_path_factory, bpe_tokenizer_dir) -> Path:
    """A second corpus of other documents, doc-packed like `doc_packed_shards`: a mix's second language group."""
    from test_mixture import shard

    return shard(tmp_path_factory, bpe_tokenizer_dir, "books", seed=1, pack="doc-packed")


def load_recipe(name: str):
    """The recipe as written, checked as a run on 8 GPUs would be (without its data)."""
    from pipeline.pretrain.preflight import load_pretrain_config

    return load_pretrain_config(RECIPES / f"{name}.json", world_size=8, cuda=True, check_files=False)


def test_every_recipe_is_here_and_the_scale_down_is_documented():
    assert sorted(p.stem for p in RECIPES.glob("*.json")) == sorted(NAMES)
    keys = [o.split("=")[0] for o in documented_scale_down()]
    assert {"train.max_steps", "train.global_batch_size", "train.micro_batch_size", "model.hidden_size"} <= set(keys)


@pytest.mark.parametrize("name", NAMES)
def test_the_tiny_variant_of_each_recipe_is_valid_on_two_cpu_ranks(name, tmp_path):
    from pipeline.pretrain.preflight import load_pretrain_config

    overrides = tiny_overrides(RECIPES / f"{name}.json", [tmp_path / "shards", tmp_path / "other"],
                               tmp_path / "tokenizer", anneal_from=tmp_path / "source")
    config = load_pretrain_config(RECIPES / f"{name}.json", overrides, world_size=2, cuda=False, check_files=False)
    assert config.train.max_steps <= 30 and config.model.hidden_size <= 64
    assert config.train.precision == "fp32"


def test_the_nvidia_recipe_keeps_its_two_phases_steps_batches_and_warmups():
    """DeepLearningExamples' BERT: 7,038 steps of 65,536 × 128 at 6e-3, then 1,563 of 32,768 × 512 at 4e-3."""
    from pipeline.pretrain.plan.phases import resolve_phases

    phases = resolve_phases(load_recipe("nvidia-bert-large-lamb"))
    assert [(p.steps, p.global_batch_size, p.lr, p.warmup_steps, p.seq_len) for p in phases] == [
        (7038, 65536, 6e-3, 2000, 128), (1563, 32768, 4e-3, 200, 512)]
    # NVIDIA's accumulation on 8 GPUs: 128 in phase 1, 512 in phase 2.
    assert [p.plan(8).accumulation for p in phases] == [128, 512]


def test_the_modernbert_recipe_spends_the_anchors_token_budgets():
    """1.719T tokens at 4,608 × 1,024, then 250B and 50B at 576 × 8,192 (each stage's max_duration)."""
    from pipeline.pretrain.plan.phases import resolve_phases
    from pipeline.pretrain.plan.schedules import lr_schedule

    config = load_recipe("modernbert-base")
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


def test_the_mmbert_recipe_lowers_masking_and_flattens_language_sampling_phase_by_phase():
    """mmBERT: 30% → 15% → 5% masking, temperatures 0.7 → 0.5 → 0.3 over a growing set of languages, 2.3T tokens
    at 4,608 × 1,024, then 600B and 100B at 4,608 × 8,192, all at 8e-4 until the last phase decays."""
    from pipeline.pretrain.plan.phases import resolve_phases
    from pipeline.pretrain.plan.schedules import lr_schedule

    config = load_recipe("mmbert-base")
    phases = resolve_phases(config)
    assert [p.name for p in phases] == ["pretrain", "mid-training", "decay"]
    assert [p.masking_probability for p in phases] == [0.3, 0.15, 0.05]
    assert [p.data.mix_temperature for p in phases] == [0.7, 0.5, 0.3]
    assert config.masking.eval_probability == 0.15  # one validation rate, so the phases' losses compare
    groups = [{c.name for c in p.data.corpora()} for p in phases]
    assert groups[0] < groups[1] < groups[2]  # each phase adds languages to the last one's
    tokens = [p.steps * p.global_batch_size * p.seq_len for p in phases]
    for spent, budget in zip(tokens, (2.3e12, 600e9, 100e9), strict=True):
        assert budget - 4608 * 8192 < spent <= budget
    assert phases[0].warmup_steps * 4608 * 1024 == pytest.approx(3e9, rel=1e-3)  # t_warmup: 3B tokens
    assert [(p.global_rope_theta, p.local_rope_theta) for p in phases] == [(1e4, 1e4), (1.6e5, 1.6e5), (1.6e5, 1.6e5)]
    lr = lr_schedule(config, phases).multiplier
    assert lr(phases[1].end - 1) == lr(phases[2].start) == 1.0 > lr(phases[2].start + 1)
    assert lr(phases[2].end) == pytest.approx(0.02)  # one_minus_sqrt to alpha_f 0.02


def test_the_mmbert_plan_gives_each_phase_its_temperature_shares_of_the_corpora():
    """Each phase draws corpus c with probability N_c^τ / Σ N^τ, N the corpora's training sequences."""
    from helpers import plan_of

    from pipeline.pretrain.plan.phases import resolve_phases

    config = load_recipe("mmbert-base")
    sizes = {"english": 8_000_000, "high-resource": 2_000_000, "mid-resource": 200_000, "low-resource": 20_000}
    plan = plan_of(config, {c.path: sizes[c.name] for p in resolve_phases(config) for c in p.data.corpora()})
    assert [(s.start, s.end) for s in plan.stretches] == [(p.start, p.end) for p in plan.phases]
    for stretch, tau in zip(plan.stretches, (0.7, 0.5, 0.3), strict=True):
        weights = [sizes[c.name] ** tau for c in stretch.corpora]
        assert [float(share) for share in stretch.shares] == pytest.approx([w / sum(weights) for w in weights])
    english = [float(s.shares[0]) for s in plan.stretches]
    assert 0.8 > english[0] > english[1] > english[2]  # under its share of the sequences, less each phase


def test_the_ettin_decay_goes_on_from_the_end_of_its_source_recipe_on_other_data():
    """Ettin: 8e-4 held through pre-training, then 1 − √ down to half in mid-training (ettin-encoder-base); the
    decay recipe anneals from that run's last checkpoint, 1 − √ from 4e-4 to 0.04 of it, at 15% masking."""
    from pipeline.pretrain.plan.phases import resolve_phases
    from pipeline.pretrain.plan.schedules import Anneal, lr_schedule

    source, decay = load_recipe("ettin-encoder-base"), load_recipe("ettin-encoder-base-decay")
    phases = resolve_phases(source)
    assert [(p.steps, p.seq_len, p.masking_probability, p.global_rope_theta, p.local_rope_theta) for p in phases] == [
        (600_000, 1024, 0.3, 1e4, 1e4), (100_000, 7999, 0.3, 1.6e5, 1.6e5)]
    lr = lr_schedule(source, phases).multiplier
    assert lr(phases[0].end - 1) == lr(phases[1].start) == 1.0 > lr(phases[1].start + 1)
    assert lr(source.train.max_steps) == pytest.approx(0.5)  # alpha_f 0.5: where the decay recipe starts
    anneal = Anneal(source.train.max_steps, decay.train.anneal_steps, source)
    decayed = lr_schedule(decay, resolve_phases(decay), anneal).multiplier
    assert decayed(anneal.start) * decay.optimizer.lr == pytest.approx(4e-4)  # prolong_decay's lr
    assert decayed(anneal.start + anneal.steps) == pytest.approx(0.04 * decayed(anneal.start))  # its alpha_f
    assert decay.train.anneal_from == source.train.output_dir and anneal.steps == 20_000
    # An anneal loads its source's optimizer state, settings included: the decay names the same ones.
    assert decay.optimizer == source.optimizer
    assert decay.train.global_batch_size == source.train.global_batch_size
    assert decay.masking.probability == 0.15 and decay.data.shards not in {p.data.shards for p in phases}
    assert (decay.model.global_rope_theta, decay.model.local_rope_theta) == (1.6e5, 1.6e5)


@pytest.mark.slow
def test_each_recipes_tiny_variant_trains_on_two_ranks_and_its_loss_falls(
        tmp_path_factory, roberta_shards, doc_packed_shards, other_doc_packed_shards, pairs_shards, bpe_tokenizer_dir,
        wordpiece_tokenizer_dir):
    from test_pretrain_distributed import DEEPSPEED, launch, step_losses

    from pipeline.common.run_layout import PretrainLayout
    from pipeline.data.shards.reader import ShardedDataset

    root = tmp_path_factory.mktemp("recipes")
    plan = {}
    for name in NAMES:  # in order: an anneal's source recipe trains before it
        shards, tokenizer = recipe_data(name, roberta_shards, doc_packed_shards, other_doc_packed_shards,
                                        pairs_shards, bpe_tokenizer_dir, wordpiece_tokenizer_dir)
        source = root / "runs" / ANNEALS[name] if name in ANNEALS else None
        plan[str(RECIPES / f"{name}.json")] = [*tiny_overrides(RECIPES / f"{name}.json", shards, tokenizer, source),
                                               f"data.cache_dir={root / 'cache' / name}"]
    (root / "plan.json").write_text(json.dumps(plan))
    launch(DEEPSPEED, "tests/dist/train_shipped_recipes.py", root / "plan.json", root / "runs", timeout=1200)
    tiny_steps = int(next(o for o in documented_scale_down() if o.startswith("train.max_steps=")).split("=")[1])
    failures = {}
    for name in NAMES:
        losses = step_losses(root / "runs" / name)
        steps = sorted(losses)
        first = tiny_steps + 1 if name in ANNEALS else 1  # an anneal goes on from its source's last step
        assert steps == list(range(first, first + len(steps))) and len(steps) >= 20, (name, steps)
        first, last = [losses[s] for s in steps[:4]], [losses[s] for s in steps[-4:]]
        if not sum(last) / 4 < sum(first) / 4 - 0.1:
            failures[name] = (first, last)
    assert not failures, f"the loss did not fall by 0.1 nats (first 4 steps, last 4): {failures}"

    def records(name: str) -> list[dict]:
        return [json.loads(line) for line in PretrainLayout(root / "runs" / name).metrics.read_text().splitlines()]

    # mmBERT: each phase change trains at the phase's masking rate, on the temperature shares of the two corpora.
    sizes = {f.name: len(ShardedDataset(f, "train")) for f in (doc_packed_shards, other_doc_packed_shards)}
    changes = [r for r in records("mmbert-base") if "masking_probability" in r]
    assert [(r["step"], r["phase"], r["masking_probability"]) for r in changes] == [
        (12, "mid-training", 0.15), (18, "decay", 0.05)]
    for change, tau in zip(changes, (0.5, 0.3), strict=True):
        weights = {corpus: n ** tau for corpus, n in sizes.items()}
        assert change["mix"] == pytest.approx({c: w / sum(weights.values()) for c, w in weights.items()}, abs=1e-4)
    # The Ettin decay: from the LR its source ended at (half the peak), 1 − √ down towards 0.02 of the peak.
    lr = {r["step"]: r["train/lr"] for r in records("ettin-encoder-base-decay") if "train/lr" in r}
    assert lr[tiny_steps + 1] == pytest.approx(0.5 * 8e-4)
    assert lr[2 * tiny_steps] == pytest.approx(8e-4 * (0.02 + 0.48 * (1 - ((tiny_steps - 1) / tiny_steps) ** 0.5)))
