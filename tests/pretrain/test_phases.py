"""Two-phase sequence length: phase steps and checks, the per-phase LR, the data hand-over, and a real run
resumed at and after the phase boundary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, plan_of, tiny_pretrain_config
from test_pretrain_distributed import launch, step_losses, write_config

from pipeline.common.config.tree import ConfigError
from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.common.run_layout import PretrainLayout
from pipeline.pretrain.checkpoints.record import read_record
from pipeline.pretrain.plan.phases import Phase, phase_ends, resolve_phases
from pipeline.pretrain.plan.schedules import Schedule, lr_schedule, segments
from pipeline.pretrain.preflight import load_pretrain_config


def phased_config(tmp_path: Path, short: Path, long: Path, tokenizer: Path, **sections) -> dict:
    """8 steps: 6 on the short shards (batch 16 = 8 × 2, LR 2e-3, warmup 2), then 2 on the long (8 = 1 × 8, 1e-3)."""
    config = tiny_pretrain_config("", tokenizer, tmp_path / "out", **sections)
    del config["data"]["shards"]
    config["phases"] = [
        {"name": "seq32", "steps_fraction": 0.75, "shards": str(short), "seq_len": 32, "micro_batch_size": 8,
         "warmup_steps": 2},
        # Accumulation 8 does not divide phase 1's 6 × 2 micro steps: the engine's boundary count must restart.
        {"name": "seq64", "steps_fraction": 0.25, "shards": str(long), "seq_len": 64, "global_batch_size": 8,
         "micro_batch_size": 1, "lr": 1e-3, "warmup_steps": 1},
    ]
    return config


def load(tmp_path: Path, data: dict, **kwargs):
    path = write_config(tmp_path / "config.json", data)
    return load_pretrain_config(path, **kwargs)


@pytest.fixture(scope="module")
def short_shards(tmp_path_factory, corpus_jsonl, bpe_tokenizer_dir) -> Path:
    """The same corpus as `roberta_shards`, packed to 32 tokens: phase 1's data."""
    from pipeline.data.shards.options import ShardOptions
    from pipeline.data.shards.stage import run_shard_stage

    out = tmp_path_factory.mktemp("shards") / "roberta32"
    run_shard_stage(ShardOptions(inputs=(str(corpus_jsonl),), tokenizer=str(bpe_tokenizer_dir), seq_len=32,
                                 out=str(out), workers=1, shard_size=100, val_fraction=0.1, quiet=True))
    return out


def test_phase_steps_split_max_steps_by_the_fractions_as_written():
    assert phase_ends([0.9, 0.1], 500_000) == [450_000, 500_000]
    assert phase_ends([0.75, 0.25], 8) == [6, 8]
    assert phase_ends([0.1, 0.2, 0.7], 10) == [1, 3, 10]  # 0.1 + 0.2 is 0.3 here, not 0.30000000000000004


def test_a_config_without_phases_is_one_phase_of_the_whole_run(tmp_path):
    config = load(tmp_path, tiny_pretrain_config("shards", "tok", tmp_path / "out"), check_files=False)
    (phase,) = resolve_phases(config)
    assert (phase.start, phase.end, phase.global_batch_size, phase.lr) == (0, 8, 16, 2e-3)
    assert phase.data.shards == "shards"
    # The LR is exactly the single-schedule one it was before phases existed.
    one = Schedule(segments(config.schedule, start=0, end=8, warmup=config.schedule.warmup_steps))
    assert [lr_schedule(config, [phase]).multiplier(s) for s in range(9)] == [one.multiplier(s) for s in range(9)]


def test_a_phase_is_built_from_keywords_only():
    with pytest.raises(TypeError):
        Phase(0, "", 0, 8, None, 16, 4, 1e-3, 2, 0.15)


def test_each_phase_warms_up_to_its_own_peak_and_decays_to_its_own_end(tmp_path):
    config = load(tmp_path, phased_config(tmp_path, Path("a"), Path("b"), Path("tok")), check_files=False)
    phases = resolve_phases(config)
    assert [(p.name, p.start, p.end, p.global_batch_size, p.micro_batch_size) for p in phases] == \
           [("seq32", 0, 6, 16, 8), ("seq64", 6, 8, 8, 1)]
    lrs = [2e-3 * lr_schedule(config, phases).multiplier(s) for s in range(8)]
    # Phase 1: warmup 1/3, 2/3 of 2e-3, peak at step 2, linear decay to 0 at step 6.
    # Phase 2 re-warms up from its own start (1/2 of its 1e-3 peak), then decays over its last step.
    expected = [2e-3 / 3, 4e-3 / 3, 2e-3, 1.5e-3, 1e-3, 0.5e-3, 0.5e-3, 1e-3]
    assert lrs == pytest.approx(expected)
    assert plan_of(config, {"a": 200, "b": 200}).sequences_seen(7) == 6 * 16 + 8


def test_a_later_phase_on_the_same_folder_continues_its_data_stream(tmp_path):
    config = load(tmp_path, phased_config(tmp_path, Path("same"), Path("same"), Path("tok")), check_files=False)
    # 6 steps of 16, then batches of 8 from the same 200 sequences
    one, two = plan_of(config, {"same": 200}).stretches
    assert (one.first_draws, two.first_draws, two.start) == ((0,), (96,), 6)  # where phase 1 stopped, exactly
    drawn = np.concatenate([one.stream(0).step_sequences(s)[1] for s in range(6)])
    first_of_two = two.stream(0).step_sequences(6)[1]
    assert len(set(drawn)) == 96 and not set(first_of_two) & set(drawn)
    # the next sequences of the same permutation
    assert sorted(first_of_two) == sorted(one.stream(0).order(0, 0).rows(np.arange(96, 104)))
    # Across an epoch: 6 steps of 16 from 40 sequences end at epoch 2, position 16: nothing skipped there.
    first, short = plan_of(config, {"same": 40}).stretches
    rows, epochs = short.stream(0).step_sequences(6)[1:]
    assert set(epochs.tolist()) == {2} and sorted(rows) == sorted(first.stream(0).order(0, 2).rows(np.arange(16, 24)))
    # Another folder starts its own stream at its beginning.
    other = load(tmp_path, phased_config(tmp_path, Path("a"), Path("b"), Path("tok")), check_files=False)
    assert plan_of(other, {"a": 200, "b": 200}).stretches[1].first_draws == (0,)


def test_bad_phases_are_all_reported_up_front_naming_their_keys(tmp_path):
    data = phased_config(tmp_path, Path("a"), Path("b"), Path("tok"))
    data["data"]["shards"] = "also-here"
    data["phases"][0]["steps_fraction"] = 0.1   # 0.1 × 8 steps = 0 steps, and the fractions sum to 0.35
    data["phases"][1]["global_batch_size"] = 10  # not a multiple of micro 1 × 4 ranks
    data["phases"][1]["name"] = "seq 64"
    with pytest.raises(ConfigError) as err:
        load(tmp_path, data, world_size=4, check_files=False)
    message = str(err.value)
    for problem in ("data.shards and phases: with phases each phase names its folder in phases[i].shards",
                    "phases[*].steps_fraction: must sum to 1, got 0.1 + 0.25 = 0.35",
                    "phases[0].steps_fraction 0.1 of train.max_steps 8 gives the phase 0 steps",
                    "phases[1].global_batch_size (or train.global_batch_size) 10 is not divisible by",
                    "phases[1].name: 'seq 64' must start with a letter or digit"):
        assert problem in message, message
    assert "phases[0].warmup_steps 2 must be between 0 and the phase's 0 steps" in message


def test_a_shard_folder_whose_seq_len_differs_from_the_phase_is_a_clear_error(tmp_path, roberta_shards,
                                                                                short_shards, bpe_tokenizer_dir):
    data = phased_config(tmp_path, short_shards, roberta_shards, bpe_tokenizer_dir)
    load(tmp_path, data)  # as written: 32 and 64 tokens
    data["phases"][1]["seq_len"] = 128
    data["phases"][1]["shards"] = str(tmp_path / "missing")
    data["phases"][0]["seq_len"] = 64
    with pytest.raises(ConfigError) as err:
        load(tmp_path, data)
    assert "phases[1].shards: shard folder" in str(err.value) and "does not exist" in str(err.value)
    data["phases"][1]["shards"] = str(roberta_shards)
    with pytest.raises(ConfigError) as err:
        load(tmp_path, data)
    assert (f"phases[0].seq_len is 64, but phases[0].shards {short_shards} holds sequences of 32 tokens"
            in str(err.value)) and "phases[1].seq_len is 128" in str(err.value)


def test_a_single_folder_smaller_than_one_global_batch_is_refused_with_or_without_phases(
        tmp_path, roberta_shards, short_shards, bpe_tokenizer_dir):
    from pipeline.data.shards.index import load_index

    train = load_index(roberta_shards)["splits"]["train"]["sequences"]
    batch = 4 * (train // 4 + 1)  # one step more than the folder holds
    plain = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "out",
                                 train={"global_batch_size": batch})
    with pytest.raises(ConfigError, match=rf"data.shards: the train split of {roberta_shards} holds {train} "
                                          rf"sequences, fewer than one global batch \({batch}\)"):
        load(tmp_path, plain)
    phased = phased_config(tmp_path, short_shards, roberta_shards, bpe_tokenizer_dir)
    phased["phases"][1].update(global_batch_size=batch, micro_batch_size=4)
    with pytest.raises(ConfigError, match=rf"phases\[1\].shards: the train split of {roberta_shards} holds {train} "
                                          rf"sequences, fewer than one global batch \({batch}\)"):
        load(tmp_path, phased)


def test_the_shipped_two_phase_config_follows_the_published_recipe_scaled_to_base():
    config = load_pretrain_config(ROOT / "configs/base-two-phase.json", world_size=8, cuda=True, check_files=False)
    one, two = resolve_phases(config)
    assert (one.name, one.seq_len, two.name, two.seq_len) == ("seq128", 128, "seq512", 512)
    # BERT's 90% / 10% of the steps; phase 1 draws NVIDIA's 7,038 × 65,536 sequences at base.json's batch 8,192.
    assert (one.steps, two.steps) == (56_304, 6_256) and one.steps * 8192 == 7038 * 65_536
    # NVIDIA: batch 65,536 at LR 6e-3, then 32,768 at 4e-3 (LAMB); scaled by √ of the batch ratio (the LAMB
    # paper's rule), warmups of 2,000 and 200 steps kept in sequences (× 8).
    assert (one.global_batch_size, two.global_batch_size, config.optimizer.name) == (8192, 4096, "lamb")
    assert one.lr == pytest.approx(6e-3 * (8192 / 65536) ** 0.5, rel=1e-4)
    assert two.lr == pytest.approx(4e-3 * (4096 / 32768) ** 0.5, rel=1e-4)
    assert (one.warmup_steps, two.warmup_steps) == (2000 * 8, 200 * 8)
    assert BatchPlan.derive(4096, two.micro_batch_size, 8).accumulation == 16


@pytest.fixture(scope="module")
def two_phase_runs(tmp_path_factory, roberta_shards, short_shards, bpe_tokenizer_dir) -> Path:
    root = tmp_path_factory.mktemp("phases")
    data = phased_config(root, short_shards, roberta_shards, bpe_tokenizer_dir,
                         data={"num_workers": 1, "cache_dir": str(root / "cache")},
                         train={"export": False}, checkpoint={"every": 1, "keep_last": 8},
                         tracking={"enabled": False, "uri": f"sqlite:///{root / 'mlflow.db'}", "experiment": "phases",
                                   "flush_seconds": 0.5})
    launch([], "tests/dist/train_two_phases.py", write_config(root / "config.json", data), root, 6, timeout=600)
    return root


@pytest.mark.slow
def test_a_run_resumed_at_or_after_the_boundary_repeats_the_uninterrupted_one(two_phase_runs):
    import torch

    root = two_phase_runs
    full = step_losses(root / "full")
    assert sorted(full) == list(range(1, 9))
    for name, first in (("at_6", 7), ("after_6", 8)):
        resumed = step_losses(root / name)
        assert sorted(resumed) == list(range(first, 9)), name
        assert all(resumed[s] == full[s] for s in resumed), (name, resumed, full)  # same batches, masks, LR: exact
    states = {name: torch.load(PretrainLayout(root / name).checkpoints / "step_00000008" / "mp_rank_00_model_states.pt",
                               weights_only=False)["module"] for name in ("full", "at_6", "after_6")}
    for name in ("at_6", "after_6"):
        assert all(torch.equal(states["full"][k], v) for k, v in states[name].items()), name
    # Positions are sized for the longest phase (64 tokens, numbered from pad id + 1) from the first step.
    positions = states["full"]["roberta.embeddings.position_embeddings.weight"].shape[0]
    assert positions == 64 + 2 and positions == states["at_6"]["roberta.embeddings.position_embeddings.weight"].shape[0]
    saved = PretrainLayout(root / "full").checkpoints
    records = {s: read_record(saved / f"step_{s:08d}") for s in (6, 7)}
    assert (records[6].phase, records[6].batch_plan.global_batch_size) == ("seq32", 16)
    assert (records[7].phase, records[7].batch_plan.global_batch_size) == ("seq64", 8)
    assert records[7].sequences_seen == 6 * 16 + 8
    assert [(s.start, s.end, s.global_batch_size, s.phase) for s in records[7].stretches] == [
        (0, 6, 16, "seq32"), (6, 7, 8, "seq64")]


@pytest.mark.slow
def test_the_hand_over_keeps_optimizer_moments_and_rebuilds_the_batch(two_phase_runs):
    handover = json.loads((two_phase_runs / "handover.json").read_text())
    assert handover["step"] == 6 and handover["nonzero_moments"] > 0
    assert handover["max_moment_change"] == 0.0  # Adam's exp_avg and exp_avg_sq, every tensor
    # Micro 8 × accumulation 2 = 16, then micro 1 × accumulation 8 = 8.
    assert handover["batch_before"] == [8, 2] and handover["batch_after"] == [1, 8]
    assert handover["train_batch_size_after"] == 8


@pytest.mark.slow
def test_one_mlflow_run_holds_both_phases_as_a_metric_and_a_tag(two_phase_runs):
    from mlflow.tracking import MlflowClient

    root = two_phase_runs
    records = [json.loads(x) for x in PretrainLayout(root / "full").metrics.read_text().splitlines()]
    assert [r["train/phase"] for r in records if "train/loss" in r] == [1] * 6 + [2] * 2
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    run = client.get_run(json.loads(PretrainLayout(root / "full").tracking.read_text())["run_id"])
    assert run.data.tags["phase"] == "seq64" and run.info.status == "FINISHED"
    history = sorted(client.get_metric_history(run.info.run_id, "train/phase"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(s, 1.0) for s in range(1, 7)] + [(7, 2.0), (8, 2.0)]
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_a_phase_may_set_its_own_mix_temperature_and_masking_rate(tmp_path):
    data = phased_config(tmp_path, Path("a"), Path("b"), Path("tok"))
    data["phases"][0].update(masking_probability=0.3)
    data["phases"][1].update(shards=[{"path": "b"}, {"path": "c"}], mix_temperature=0.5, masking_probability=0.05)
    config = load(tmp_path, data, check_files=False)
    one, two = resolve_phases(config)
    assert (one.masking_probability, two.masking_probability) == (0.3, 0.05)
    # p_c ∝ N_c^τ over the corpora's training sequences: 100 and 400 sequences at τ 0.5 give 1:2.
    plan = plan_of(config, {"a": 200, "b": 100, "c": 400})
    assert [str(s) for s in plan.stretches[1].shares] == ["1/3", "2/3"]
    assert plan.stretches[1].first_draws == (0, 0)  # b and c: no earlier phase drew from them


def test_bad_phase_mixes_and_rates_are_reported_naming_their_keys(tmp_path):
    data = phased_config(tmp_path, Path("a"), Path("b"), Path("tok"))
    data["phases"][0].update(masking_probability=1.5, mix_temperature=0.7)  # a single folder: no mix to sample
    data["phases"][1].update(shards=[{"path": "b", "weight": 2}, {"path": "c"}], mix_temperature=-1)
    with pytest.raises(ConfigError) as err:
        load(tmp_path, data, check_files=False)
    problems = err.value.problems
    assert any(p.startswith("phases[0].masking_probability: must be in (0, 1)") for p in problems)
    assert any(p.startswith("phases[0].mix_temperature: applies to a mix of corpora") for p in problems)
    assert any(p.startswith("phases[1].mix_temperature: must be a positive number") for p in problems)


def test_each_stretch_masks_at_its_phases_rate(tmp_path, roberta_shards, bpe_tokenizer_dir):
    from test_eval_masking import masked_fraction

    from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
    from pipeline.pretrain.batches.stretch_data import PretrainData
    from pipeline.pretrain.preflight import prepare_run

    data = phased_config(tmp_path, roberta_shards, roberta_shards, bpe_tokenizer_dir,
                         data={"cache_dir": str(tmp_path / "cache")})
    for phase, rate in zip(data["phases"], (0.3, 0.05), strict=True):
        phase.update(seq_len=None, masking_probability=rate)
    plan = prepare_run(write_config(tmp_path / "config.json", data))
    tokenizer = load_tokenizer(str(bpe_tokenizer_dir))
    info = describe_tokenizer(tokenizer, str(bpe_tokenizer_dir))
    for stretch, rate in zip(plan.stretches, (0.3, 0.05), strict=True):
        feed = PretrainData.for_stretch(stretch, stretch.plan(plan.world_size), plan, tokenizer, info)
        keys = [feed.stream.micro_batch(step, k) for step in range(stretch.start, stretch.end)
                for k in range(feed.plan.accumulation)]
        assert masked_fraction(feed.train_batches, keys, tokenizer.all_special_ids) == pytest.approx(rate, abs=0.03)
        (val,) = feed.eval_sets(32, 4, 0, 1)  # validation keeps the run's one rate, so losses compare
        assert masked_fraction(feed.val_batches, val, tokenizer.all_special_ids) == pytest.approx(0.15, abs=0.04)
