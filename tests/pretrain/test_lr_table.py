"""The LR at every sampled step of every shipped config and recipe, of the phase, batch-warmup and anneal test
configs, and the data plan (each stretch's batch and stream start) of those in phases or under a batch warmup, are
the ones the pipeline gave before the schedule became one closed form.

lr_table.json was recorded with the code before the rewrite (it names the commit): the LR as a multiple of
optimizer.lr at the first 100 steps, about 300 more spread over the run, and every step within 2 of a
phase's start, warmup end, decay start and end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline.common.config_tree import build_config
from pipeline.pretrain.anneal import resolve_anneal
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.engine import lr_scheduler
from pipeline.pretrain.phases import resolve_phases, resolve_stretches, samples_consumed, stream_start
from pipeline.pretrain.schedules import lr_schedule

TABLE = json.loads((Path(__file__).parent / "lr_table.json").read_text())["cases"]


def build(data: dict) -> PretrainConfig:
    config, problems = build_config(PretrainConfig, data)
    assert not problems, problems
    return config


def case_schedule(case: dict, tmp_path: Path):
    """The case's config and its schedule, an anneal's from a checkpoint marker like the one a run writes."""
    data = json.loads(json.dumps(case["config"]))
    if "source_step" in case:
        checkpoint = tmp_path / "source" / "checkpoints" / f"step_{case['source_step']:08d}"
        checkpoint.mkdir(parents=True)
        marker = {"step": case["source_step"], **({"config": case["source_config"]} if case["source_config"] else {})}
        (checkpoint / "complete.json").write_text(json.dumps(marker))
        data["train"]["anneal_from"] = str(checkpoint)
    config = build(data)
    return config, lr_schedule(config, resolve_phases(config), resolve_anneal(config))


@pytest.mark.parametrize("case", TABLE, ids=[c["name"] for c in TABLE])
def test_the_schedule_gives_the_recorded_lr_at_every_sampled_step(case, tmp_path):
    _, schedule = case_schedule(case, tmp_path)
    got = [schedule.multiplier(step) for step in case["steps"]]
    assert got == pytest.approx(case["lr"], abs=1e-12, rel=0)


@pytest.mark.parametrize("case", [c for c in TABLE if c["steps"][-1] <= 40], ids=lambda c: c["name"])
def test_the_engines_scheduler_steps_through_the_recorded_lrs(case, tmp_path):
    config, schedule = case_schedule(case, tmp_path)
    peak = config.optimizer.lr
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    scheduler = lr_scheduler(optimizer, schedule)
    seen = {}
    for step in range(case["steps"][-1] + 1):
        seen[step] = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
    for step, lr in zip(case["steps"], case["lr"], strict=True):
        if step >= case["steps"][0]:
            assert seen[step] == pytest.approx(peak * lr, abs=1e-12 * peak, rel=0), step


@pytest.mark.parametrize("case", [c for c in TABLE if "stretches" in c], ids=lambda c: c["name"])
def test_each_stretch_keeps_its_recorded_batch_and_stream_start(case, monkeypatch):
    import pipeline.data.shard_index as shard_index

    # A batch warmup reads its sequence length from the shard index; the table recorded the one it ran with.
    monkeypatch.setattr(shard_index, "load_index", lambda folder: {"seq_len": case["seq_len"]})
    config = build(case["config"])
    stretches = resolve_stretches(config, resolve_phases(config), config.train.max_steps)
    many, few = case["num_sequences"]
    assert [[s.start, s.end, s.global_batch_size, stream_start(stretches, k, many), stream_start(stretches, k, few)]
            for k, s in enumerate(stretches)] == case["stretches"]
    assert {str(n): samples_consumed(stretches, n) for n in case["steps"]} == case["samples_consumed"]


def test_the_table_covers_every_shipped_config_and_recipe():
    from helpers import ROOT

    shipped = {str(p.relative_to(ROOT)) for p in [*ROOT.glob("configs/*.json"), *ROOT.glob("configs/recipes/*.json")]}
    assert shipped <= {c["name"] for c in TABLE}  # each case holds the config it was recorded with
