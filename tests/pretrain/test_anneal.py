"""Annealing from a checkpoint: the decay's formula, its config checks, and a real anneal (data stream, LR, resume)."""

from __future__ import annotations

import json
import math

import pytest
from helpers import tiny_pretrain_config

from pipeline.common.errors import PipelineError
from pipeline.pretrain.config import OptimizerConfig, ScheduleConfig
from pipeline.pretrain.plan.phases import resolve_phases
from pipeline.pretrain.plan.schedules import Anneal, lr_schedule
from pipeline.pretrain.preflight import load_pretrain_config, prepare_run


def anneal(decay: str, power: float = 1.0):
    """The schedule of a 10-step anneal from step 100 of a run whose LR there was 0.8 of the peak."""
    from pipeline.pretrain.config import DataConfig, PretrainConfig

    data = DataConfig(shards="shards", tokenizer="tokenizer")
    source = PretrainConfig(data=data, optimizer=OptimizerConfig(lr=0.8 * OptimizerConfig().lr),
                            schedule=ScheduleConfig(warmup_steps=0, decay="constant"))
    wsd = {"kind": "wsd", "decay_fraction": 0.2} if decay == "1-sqrt" else {}  # a WSD-only shape
    config = PretrainConfig(data=data, schedule=ScheduleConfig(decay=decay, power=power, end_lr_ratio=0.1, **wsd))
    return Anneal(start=100, steps=10, source=source), config


@pytest.mark.parametrize(("decay", "shape"), [
    ("linear", lambda p: 1 - p),
    ("polynomial", lambda p: (1 - p) ** 2),
    ("cosine", lambda p: (1 + math.cos(math.pi * p)) / 2),
    ("1-sqrt", lambda p: 1 - math.sqrt(p)),
])
def test_the_decay_runs_from_the_checkpoints_lr_towards_the_floor_in_the_schedules_shape(decay, shape):
    a, config = anneal(decay, power=2.0)
    schedule = lr_schedule(config, resolve_phases(config), a)
    assert schedule.multiplier(100) == pytest.approx(0.8)  # the first annealed step keeps the checkpoint's LR
    for k in range(10):
        assert schedule.multiplier(100 + k) == pytest.approx(0.1 + 0.7 * shape(k / 10))
    assert schedule.multiplier(110) == pytest.approx(0.1)  # past the end: the floor


def write(tmp_path, roberta_shards, bpe_tokenizer_dir, **train):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "run", train=train)))
    return path


def test_a_missing_checkpoint_is_a_config_error_naming_the_key_before_any_training(tmp_path, roberta_shards,
                                                                                    bpe_tokenizer_dir):
    config = write(tmp_path, roberta_shards, bpe_tokenizer_dir, anneal_from=str(tmp_path / "nowhere/step_00000004"),
                   anneal_steps=4)
    with pytest.raises(PipelineError, match=r"train\.anneal_from: .*no complete checkpoint found"):
        load_pretrain_config(config)


def test_the_two_keys_come_together_and_the_steps_are_positive(tmp_path, roberta_shards, bpe_tokenizer_dir):
    with pytest.raises(PipelineError, match="give both"):
        load_pretrain_config(write(tmp_path, roberta_shards, bpe_tokenizer_dir, anneal_steps=4))
    with pytest.raises(PipelineError, match=r"train\.anneal_steps: must be ≥ 1"):
        load_pretrain_config(write(tmp_path, roberta_shards, bpe_tokenizer_dir, anneal_from="x", anneal_steps=0),
                             check_files=False)


def test_a_constant_schedule_has_no_decay_to_anneal(tmp_path, roberta_shards, bpe_tokenizer_dir):
    config = write(tmp_path, roberta_shards, bpe_tokenizer_dir, anneal_from="x", anneal_steps=3)
    with pytest.raises(PipelineError, match="schedule.decay 'constant'"):
        load_pretrain_config(config, ["schedule.decay=constant"], check_files=False)


def test_the_launcher_flags_set_the_two_keys():
    from pipeline.commands import pretrain as launcher

    args = launcher.parse_args(["--config", "c.json", "--anneal-from", "run/checkpoints/step_00000100",
                                "--anneal-steps", "50"])
    assert launcher.overrides(args) == ['train.anneal_from="run/checkpoints/step_00000100"', "train.anneal_steps=50"]


@pytest.mark.slow
def test_an_anneal_continues_the_stable_runs_data_decays_by_formula_and_resumes_exactly(tmp_path, roberta_shards,
                                                                                         bpe_tokenizer_dir):
    """One process, three runs (tests/dist/anneal_from_checkpoint.py)."""
    from test_pretrain_distributed import launch, step_losses, write_config

    start, steps, peak = 6, 6, 2e-3
    config = write_config(tmp_path / "config.json", tiny_pretrain_config(
        roberta_shards, bpe_tokenizer_dir, tmp_path / "unused", data={"num_workers": 0, "cache_dir": str(tmp_path)},
        train={"export": False, "max_steps": 10}, checkpoint={"every": 2, "keep_last": 10},
        optimizer={"lr": peak}, schedule={"warmup_steps": 2, "end_lr_ratio": 0.1}))
    launch([], "tests/dist/anneal_from_checkpoint.py", config, tmp_path, start, steps, timeout=400)
    # The real checkpoint's optimizer against another: refused before any step, naming both.
    assert "was trained with optimizer adamw; this config says stableadamw (optimizer.name)" in (
        tmp_path / "refused.txt").read_text()
    seen = {name: {int(k): v for k, v in json.loads((tmp_path / f"{name}-batches.json").read_text()).items()}
            for name in ("stable", "anneal", "resumed")}
    # The data stream: the anneal's first steps draw the batches the stable run drew after its checkpoint.
    assert sorted(seen["anneal"]) == list(range(start + 1, start + steps + 1))
    for step in range(start + 1, 11):
        assert seen["anneal"][step] == seen["stable"][step]
    # The LR: from the stable schedule's LR at the checkpoint's step, linearly to the floor over the anneal.
    stable_lr = {r["step"]: r["train/lr"] for r in map(json.loads, (tmp_path / "stable/metrics.jsonl").open())
                 if "train/lr" in r}
    m_start = 0.1 + 0.9 * (1 - (start - 2) / (10 - 2))  # linear decay of the 10-step plan, warmup 2
    assert stable_lr[start + 1] == pytest.approx(peak * m_start)
    anneal_records = [json.loads(line) for line in (tmp_path / "anneal/metrics.jsonl").open()]
    anneal_lr = {r["step"]: r["train/lr"] for r in anneal_records if "train/lr" in r}
    for k in range(steps):
        assert anneal_lr[start + 1 + k] == pytest.approx(peak * (0.1 + (m_start - 0.1) * (1 - k / steps)))
    # Resumed from the anneal's own first checkpoint: the same batches and losses as the uninterrupted anneal.
    cut = int((tmp_path / "resumed-from.txt").read_text().split("_")[1])
    assert cut == start + 2
    assert sorted(seen["resumed"]) == list(range(cut + 1, start + steps + 1))
    assert all(seen["resumed"][s] == seen["anneal"][s] for s in seen["resumed"])
    annealed, resumed = step_losses(tmp_path / "anneal"), step_losses(tmp_path / "resumed")
    assert sorted(resumed) == list(range(start + 1, start + steps + 1))
    assert all(resumed[s] == annealed[s] for s in range(cut + 1, start + steps + 1))


def test_the_decay_starts_from_the_lr_of_the_checkpoints_own_schedule(tmp_path, roberta_shards, bpe_tokenizer_dir):
    """A stable phase at constant LR (as WSD's) anneals from its peak, whatever the anneal config's own schedule."""
    from pipeline.common.config.tree import to_dict

    stable = load_pretrain_config(write(tmp_path, roberta_shards, bpe_tokenizer_dir, max_steps=100),
                                  ["schedule.decay=constant", "schedule.warmup_steps=10"])
    checkpoint = tmp_path / "stable" / "checkpoints" / "step_00000060"
    checkpoint.mkdir(parents=True)
    (checkpoint / "complete.json").write_text(json.dumps({"step": 60, "config": to_dict(stable)}))
    plan = prepare_run(write(tmp_path, roberta_shards, bpe_tokenizer_dir, anneal_from=str(checkpoint),
                             anneal_steps=20, global_batch_size=16), ["schedule.end_lr_ratio=0.1"])
    a, schedule = plan.anneal, plan.schedule
    assert (a.start, plan.end_step, schedule.multiplier(60), schedule.multiplier(80)) == (60, 80, 1.0, 0.1)
    assert schedule.multiplier(70) == pytest.approx(0.55)
