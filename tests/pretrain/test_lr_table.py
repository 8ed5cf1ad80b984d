"""The LR at every sampled step of every shipped config and recipe, of the phase, batch-warmup and anneal test
configs, and the steps and batch of each stretch of those in phases or under a batch warmup, are the ones the
pipeline gave before the schedule became one closed form.

lr_table.json was recorded with the code before the rewrite (it names the commit): the LR as a multiple of
optimizer.lr at the first 100 steps, about 300 more spread over the run, and every step within 2 of a
phase's start, warmup end, decay start and end. Recipes added since were recorded with the code of their
day, the commit its "about" names.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from pipeline.common.config.tree import build_config
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.plan.phases import resolve_phases
from pipeline.pretrain.plan.schedules import Anneal, lr_schedule, lr_scheduler

TABLE = json.loads((Path(__file__).parent / "lr_table.json").read_text())["cases"]


def build(data: dict) -> PretrainConfig:
    config, problems = build_config(PretrainConfig, data)
    assert not problems, problems
    return config


def case_schedule(case: dict, tmp_path: Path):
    """The case's config and its schedule, an anneal's from its source checkpoint's step and recorded config."""
    data = json.loads(json.dumps(case["config"]))
    if "source_step" in case:
        data["train"]["anneal_from"] = "source"
    config = build(data)
    anneal = None
    if "source_step" in case:
        source = build(case["source_config"]) if case["source_config"] else config
        anneal = Anneal(case["source_step"], int(config.train.anneal_steps), source)
    return config, lr_schedule(config, resolve_phases(config), anneal)


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
def test_each_stretch_keeps_its_recorded_steps_and_batch_and_draws_on_where_its_folder_stopped(case):
    from helpers import plan_of

    config = build(case["config"])
    folders = {s.path for p in resolve_phases(config) for s in p.data.corpora()}
    # A batch warmup's ramp counts tokens in the sequence length the table recorded it with.
    plan = plan_of(config, dict.fromkeys(folders, case["num_sequences"][0]), seq_len=case["seq_len"] or 64)
    assert [[s.start, s.end, s.global_batch_size] for s in plan.stretches] == [row[:3] for row in case["stretches"]]
    assert {str(n): plan.sequences_seen(n) for n in case["steps"]} == case["samples_consumed"]
    for k, stretch in enumerate(plan.stretches):  # each folder's stream goes on exactly where it stopped
        earlier = Counter()
        for s in plan.stretches[:k]:
            earlier.update({c.path: int(n) for c, n in zip(s.corpora, s.drawn(s.end) - s.first_draws, strict=True)})
        assert stretch.first_draws == tuple(earlier[c.path] for c in stretch.corpora)


def test_the_table_covers_every_shipped_config_and_recipe():
    from helpers import ROOT

    shipped = {str(p.relative_to(ROOT)) for p in [*ROOT.glob("configs/*.json"), *ROOT.glob("configs/recipes/*.json")]}
    assert shipped <= {c["name"] for c in TABLE}  # each case holds the config it was recorded with
