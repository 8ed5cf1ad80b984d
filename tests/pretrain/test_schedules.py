"""LR schedules: each equals its closed form (and transformers' own schedule) at every step, phases included, a
scheduler resumed from its state_dict goes on with the same LRs, and a resume that changes the schedule (an anneal)
takes the new schedule's LR at its step."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from helpers import tiny_pretrain_config
from test_phases import load

from pipeline.common.config.tree import ConfigError
from pipeline.pretrain.config import ScheduleConfig
from pipeline.pretrain.plan.phases import resolve_phases
from pipeline.pretrain.plan.schedules import Schedule, lr_schedule, lr_scheduler, restore_step, segments


def lr_multiplier(step: int, s: ScheduleConfig, steps: int) -> float:
    """The schedule of one phase of `steps` at the peak."""
    return Schedule(segments(s, start=0, end=steps, warmup=s.warmup_steps)).multiplier(step)


def warmup(step: int, w: int) -> float:
    return (step + 1) / (w + 1)


def cosine_formula(step: int, w: int, n: int, end: float) -> float:
    if step < w:
        return warmup(step, w)
    return end + (1 - end) * 0.5 * (1 + math.cos(math.pi * min(step - w, n - w) / (n - w)))


def modernbert_one_minus_sqrt(n: int, n_t: int, n_c: int, alpha: float) -> float:
    """ModernBERT's OneMinusSqrtScheduler: 1 until N_T − N_C, then α + (1 − α)(1 − √((n − (N_T − N_C)) / N_C))."""
    if n <= n_t - n_c:
        return 1.0
    return alpha + (1 - alpha) * (1 - math.sqrt((n - (n_t - n_c)) / n_c))


def wsd_formula(step: int, w: int, d: int, n: int, end: float, shape: str) -> float:
    if step < w:
        return warmup(step, w)
    if step >= n:
        return end
    p = max(0.0, (step - (n - d)) / d)
    f = {"linear": 1 - p, "cosine": 0.5 * (1 + math.cos(math.pi * p)), "1-sqrt": 1 - math.sqrt(p)}[shape]
    return end + (1 - end) * f


@pytest.mark.parametrize("end", [0.0, 0.1])
def test_cosine_decay_is_a_half_cosine_from_the_warmups_end_to_end_lr_ratio(end):
    s = ScheduleConfig(warmup_steps=5, decay="cosine", end_lr_ratio=end)
    for step in range(41):
        assert lr_multiplier(step, s, 40) == pytest.approx(cosine_formula(step, 5, 40, end), abs=1e-12), step
    assert lr_multiplier(40, s, 40) == pytest.approx(end)


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_wsd_warms_up_holds_the_peak_then_decays_over_its_last_steps(shape):
    s = ScheduleConfig(kind="wsd", warmup_steps=4, decay=shape, decay_steps=10, end_lr_ratio=0.05)
    values = [lr_multiplier(step, s, 30) for step in range(31)]
    assert values == pytest.approx([wsd_formula(step, 4, 10, 30, 0.05, shape) for step in range(31)], abs=1e-12)
    assert values[4:21] == [1.0] * 17  # stable from the warmup's end to the decay's start (step 20)
    assert values[30] == pytest.approx(0.05)


def test_the_1_sqrt_wsd_is_modernberts_trapezoid_and_decay_fraction_gives_its_length():
    s = ScheduleConfig(kind="wsd", warmup_steps=0, decay="1-sqrt", decay_fraction=0.1, end_lr_ratio=0.02)
    assert all(lr_multiplier(n, s, 500) == pytest.approx(modernbert_one_minus_sqrt(n, 500, 50, 0.02), abs=1e-12)
               for n in range(501))


def test_a_wsd_phase_with_decay_steps_0_stays_at_its_peak_and_the_last_phase_decays(tmp_path):
    data = tiny_pretrain_config("", "tok", tmp_path / "out", schedule={"kind": "wsd", "decay": "1-sqrt",
                                                                       "decay_steps": 4, "warmup_steps": 2},
                                train={"max_steps": 20})
    del data["data"]["shards"]
    data["phases"] = [{"name": "stable", "steps_fraction": 0.5, "shards": "a", "decay_steps": 0},
                      {"name": "long", "steps_fraction": 0.5, "shards": "b", "warmup_steps": 0, "lr": 1e-3}]
    config = load(tmp_path, data, check_files=False)
    phases = resolve_phases(config)
    schedule = lr_schedule(config, phases)
    lrs = [schedule.multiplier(step) for step in range(20)]
    assert lrs[:10] == pytest.approx([1 / 3, 2 / 3] + [1.0] * 8)
    assert lrs[10:] == pytest.approx([0.5 * wsd_formula(s, 0, 4, 10, 0.0, "1-sqrt") for s in range(10)])


@pytest.mark.parametrize("schedule", [
    {"decay": "cosine", "warmup_steps": 3, "end_lr_ratio": 0.1},
    {"kind": "wsd", "decay": "1-sqrt", "decay_fraction": 0.25, "warmup_steps": 3},
])
def test_a_scheduler_restored_from_its_state_dict_goes_on_with_the_formulas_lrs(tmp_path, schedule):
    data = tiny_pretrain_config("shards", "tok", tmp_path / "out", schedule=schedule, train={"max_steps": 16})
    config = load(tmp_path, data, check_files=False)
    peak = config.optimizer.lr

    def build():
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=peak)
        return optimizer, lr_scheduler(optimizer, lr_schedule(config, resolve_phases(config)))

    optimizer, scheduler = build()
    seen = []
    for step in range(16):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        if step == 6:
            saved = (optimizer.state_dict(), scheduler.state_dict())
    resumed_optimizer, resumed = build()
    resumed_optimizer.load_state_dict(saved[0])
    resumed.load_state_dict(saved[1])
    after = []
    for _ in range(7, 16):
        after.append(resumed_optimizer.param_groups[0]["lr"])
        resumed_optimizer.step()
        resumed.step()
    assert after == seen[7:]
    assert seen == pytest.approx([peak * lr_multiplier(step, config.schedule, 16) for step in range(16)], abs=0)


@pytest.mark.parametrize(("factory", "kwargs", "ours"), [
    ("get_cosine_with_min_lr_schedule_with_warmup", {"num_warmup_steps": 0, "num_training_steps": 37,
                                                     "min_lr_rate": 0.1},
     ScheduleConfig(warmup_steps=0, decay="cosine", end_lr_ratio=0.1)),
    *[("get_wsd_schedule", {"num_warmup_steps": 0, "num_stable_steps": 25, "num_decay_steps": 12, "decay_type": shape,
                            "min_lr_ratio": 0.05},
       ScheduleConfig(kind="wsd", warmup_steps=0, decay=shape, decay_steps=12, end_lr_ratio=0.05))
      for shape in ("linear", "cosine", "1-sqrt")],
])
def test_the_closed_forms_are_transformers_schedules(factory, kwargs, ours):
    import transformers.optimization as schedules

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    theirs = getattr(schedules, factory)(optimizer, **kwargs).lr_lambdas[0]
    assert [lr_multiplier(n, ours, 37) for n in range(38)] == pytest.approx([theirs(n) for n in range(38)],
                                                                             abs=1e-12)


def test_a_resume_restores_the_step_and_the_lr_follows_from_the_resumed_runs_schedule():
    """An anneal loads a checkpoint its source run's scheduler and optimizer saved; its own schedule gives the LR."""
    source = Schedule(segments(ScheduleConfig(warmup_steps=2, decay="constant"), start=0, end=100, warmup=2))
    anneal = Schedule(segments(ScheduleConfig(warmup_steps=0, decay="cosine", end_lr_ratio=0.1), start=0, end=20,
                               warmup=0))

    def build(schedule):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
        return optimizer, lr_scheduler(optimizer, schedule)

    optimizer, scheduler = build(source)
    for _ in range(10):
        optimizer.step()
        scheduler.step()
    saved = (optimizer.state_dict(), scheduler.state_dict())
    resumed_optimizer, resumed = build(anneal)
    resumed_optimizer.load_state_dict(saved[0])  # as DeepSpeed's load_checkpoint does
    resumed.load_state_dict(saved[1])
    assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)  # the source's LR, saved with it
    restore_step(resumed, 10)
    seen = []
    for _ in range(10, 20):
        seen.append(resumed_optimizer.param_groups[0]["lr"])
        resumed_optimizer.step()
        resumed.step()
    assert seen == pytest.approx([1e-3 * anneal.multiplier(n) for n in range(10, 20)], abs=1e-15)
    assert seen[0] < 1e-3


@pytest.mark.parametrize(("schedule", "expected"), [
    ({"kind": "wsd", "decay": "1-sqrt"}, "schedule.decay_steps or schedule.decay_fraction: kind wsd needs exactly one"),
    ({"kind": "wsd", "decay": "polynomial", "decay_steps": 2}, "schedule.decay: kind wsd decays as one of"),
    ({"decay": "1-sqrt"}, "schedule.decay: 1-sqrt is a WSD decay; set schedule.kind wsd"),
    ({"decay": "cosine", "decay_steps": 3}, "schedule.decay_steps: only for schedule.kind wsd"),
    ({"kind": "wsd", "decay": "linear", "decay_steps": 7, "warmup_steps": 2}, "exceed train.max_steps 8"),
])
def test_schedule_mistakes_name_their_keys(tmp_path, schedule, expected):
    data = tiny_pretrain_config("shards", "tok", tmp_path / "out")
    data["schedule"] = schedule
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.").replace("(", r"\(")):
        load(tmp_path, data, check_files=False)


def test_putting_a_new_run_at_step_zero_warns_of_nothing():
    """A restored step is no step taken: torch's warning of a scheduler stepped before its optimizer stays out of
    every rank's log."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 ** step)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restore_step(scheduler, 0)
        restore_step(scheduler, 3)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5 ** 3)
