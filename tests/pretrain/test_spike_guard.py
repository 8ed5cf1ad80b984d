"""The spike guard (`train.spike_guard`): what it calls an outlier, when its window re-arms, what `skip` leaves out,
how `rollback` goes back, how many times for one spike and when it gives up, on 1 and 2 ranks; where config.py
refuses it; what the ledger keeps of it. Its device reads are counted with every other step's
(test_device_reads.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers import tiny_pretrain_config
from test_pretrain_distributed import DEEPSPEED, launch, write_config

from pipeline.common.config.tree import ConfigError
from pipeline.common.run_layout import PretrainLayout
from pipeline.pretrain.checkpoints.ledger import (
    GaveUpEvent,
    Ledger,
    RollbackEvent,
    SetAsideEvent,
    SkipEvent,
    UpdatesSkippedEvent,
    read_ledger,
)
from pipeline.pretrain.checkpoints.record import read_record
from pipeline.pretrain.checkpoints.storage import newest_complete
from pipeline.pretrain.config import DataConfig, GuardConfig, PretrainConfig, TrainConfig
from pipeline.pretrain.guard.spike_guard import SpikeGuard, level_of
from pipeline.pretrain.guard.spike_response import GiveUp, SpikeResponse, spike_rollbacks
from pipeline.pretrain.step.step_sync import CheckedLosses

STEPS = 16


def guard(mode: str = "skip", precision: str = "fp32", window: int = 8, min_steps: int = 4) -> SpikeGuard:
    config = PretrainConfig(data=DataConfig(shards="shards", tokenizer="tokenizer"),
                            train=TrainConfig(spike_guard=mode, precision=precision),
                            guard=GuardConfig(window=window, min_steps=min_steps))
    return SpikeGuard(config, "cpu", world_size=1)


def judged(g: SpikeGuard, steps: list[tuple[float, float]], first: int = 1) -> list[int]:
    """Feed (loss, gradient norm) of consecutive steps; the steps the guard called outliers."""
    outliers = []
    for step, (loss, norm) in enumerate(steps, first):
        g.loss(step, [torch.tensor(loss)])
        g.judge(torch.tensor(norm))
        if g.skip.item():
            outliers.append(step)
    return outliers


def calm(n: int, loss: float = 5.0, norm: float = 1.0) -> list[tuple[float, float]]:
    """`n` steps whose loss and norm wobble by about 1%."""
    return [(loss * (1 + 0.01 * math.sin(i)), norm * (1 + 0.01 * math.cos(i))) for i in range(n)]


def test_an_outlier_is_a_loss_or_norm_far_above_the_window_and_a_spike_does_not_lift_the_bar():
    assert judged(guard(), calm(2) + [(5.0, 100.0)]) == []  # the window holds fewer than min_steps: not judged
    g = guard()
    steps = calm(4) + [(5.0, 100.0)] + calm(3) + [(50.0, 1.0), (5.0, 100.0)]
    assert judged(g, steps) == [5, 9, 10]  # step 5 entered the window at the bar, so 10 is still far above it
    assert judged(g, [(5.0, float("nan")), (float("inf"), 1.0)], first=11) == [11, 12]  # non-finite: always

    spike = g.verdict(g.readout().tolist(), 12)
    assert (spike.count, spike.nonfinite, spike.since, spike.window, spike.first, spike.last) == (
        5, 2, (5, 9, 10, 11, 12), (5, 9, 10, 11, 12), 5, 12)
    later = g.verdict(g.readout().tolist(), 12)  # a readout starts a new count; the window keeps its own
    assert (later.count, later.since, later.window) == (0, (), (5, 9, 10, 11, 12))


def test_a_lasting_change_of_level_is_followed():
    g = guard()
    judged(g, calm(8))
    after = judged(g, calm(40, loss=7.0), first=9)  # each outlier enters the window at the bar, which rises
    assert after and max(after) < 9 + 20, after


def test_the_window_re_arms_whenever_what_it_measures_changes_however_the_run_gets_there(tmp_path, roberta_shards,
                                                                                         bpe_tokenizer_dir):
    """A new phase, a mix or a config edited at a resume: the window starts empty and judges again after
    min_steps. A batch warmup's next batch, or the same stretch loaded again (a rollback), keeps it."""
    from pipeline.pretrain.preflight import prepare_run

    written = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "x")
    del written["data"]["shards"]
    written["phases"] = [{"name": name, "shards": str(roberta_shards), "steps_fraction": 0.5} for name in "ab"]
    config = write_config(tmp_path / "c.json", written)
    plan = prepare_run(config)
    first, second = (level_of(s, plan.config) for s in plan.stretches)
    edited = prepare_run(config, ["optimizer.lr=0.01"])
    assert len({first, second, level_of(edited.stretches[0], edited.config)}) == 3
    warmup = prepare_run(config, ["phases=[]", f"data.shards={json.dumps(str(roberta_shards))}",
                                  "train.batch_warmup_tokens=1024", "train.batch_warmup_start=4"])
    assert len(warmup.stretches) > 1 and len({level_of(s, warmup.config) for s in warmup.stretches}) == 1

    g = guard()
    assert not g.enter(first)  # a run's start: no window to drop, nothing to say
    judged(g, calm(8))
    saved = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in g.state_dict().items()}
    assert not g.enter(first)  # the same level: the window stays
    assert judged(g, [(50.0, 1.0)], first=9) == [9]
    resumed = guard()  # a resume (or a rollback) onto the phase boundary: the checkpoint's window is phase a's
    resumed.load_state_dict(saved, step=8)
    assert resumed.enter(second)  # a window dropped: the run says so
    assert judged(resumed, [(50.0, 1.0)] * 3, first=9) == []  # not judged again before min_steps
    old = guard()  # a checkpoint from before levels were kept: its window's level is unknown
    old.load_state_dict({**saved, "level": None}, step=8)
    assert not old.enter(first)
    assert judged(old, [(50.0, 1.0)], first=9) == []


def check(g: SpikeGuard, step: int) -> CheckedLosses:
    """What a check after `step` steps brings to the host of the guard's figures."""
    return CheckedLosses(5.0, {}, 5.0, step, 0.0, guard=g.readout().tolist())


class Noted:
    """The checkpointer's and the run log's part in a response, recorded: the ledger's notes and the reports."""

    def __init__(self):
        self.notes, self.reports = [], []

    def carry_out(self, plan, response, info):
        self.notes += response.events
        return response

    def responded(self, response, step, config):
        self.reports.append((response.action, response.spike.since))


def respond(g: SpikeGuard, config: PretrainConfig, ledger: Ledger | None = None) -> tuple[SpikeResponse, Noted, object]:
    from types import SimpleNamespace

    from pipeline.common.processes.topology import Topology

    noted = Noted()
    plan = SimpleNamespace(config=config, ledger=ledger or Ledger(Path("ledger.jsonl")), end_step=100)
    return SpikeResponse(g, noted, noted, info=None, topology=Topology(0, 0, 1, False)), noted, plan


def test_skip_stops_a_run_whose_updates_it_mostly_leaves_out():
    g = guard()
    response, noted, plan = respond(g, PretrainConfig(data=DataConfig(shards="s", tokenizer="t"),
                                                      train=TrainConfig(spike_guard="skip"),
                                                      guard=GuardConfig(window=8, min_steps=4)))
    assert judged(g, calm(4) + [(5.0, float("nan"))] * 4) == [5, 6, 7, 8]
    assert response.after_check(plan, check(g, 8), 8).action == "skip"  # half the window's updates: it goes on
    assert noted.notes == [UpdatesSkippedEvent((5, 6, 7, 8), 4, 8)]
    judged(g, [(5.0, float("nan"))], first=9)
    with pytest.raises(GiveUp, match=r"the updates of 5 of the last 8 steps were left out \(steps 5-9\): the loss "
                                     r"has moved, not spiked"):
        response.after_check(plan, check(g, 9), 9)
    assert noted.reports[-1] == ("give up", (9,)) and isinstance(noted.notes[-1], GaveUpEvent)
    assert noted.notes[-1].outliers == (5, 6, 7, 8, 9)


def test_rollback_leaves_out_each_outlier_before_rollback_after_as_skip_does_checkpoint_behind_or_not(tmp_path):
    """The default rollback_after 2: a single outlier costs its update, never a rollback, and never reaches the
    weights, whether a checkpoint lies behind the run or not. A second (or a non-finite loss) with no checkpoint of the
    run before it: nothing to go back to, so its update is left out too and the run goes on."""
    config = PretrainConfig(data=DataConfig(shards="s", tokenizer="t"), train=TrainConfig(
        spike_guard="rollback", output_dir=str(tmp_path / "run")), guard=GuardConfig(window=8, min_steps=4))
    assert config.guard.rollback_after == 2
    g = guard("rollback")
    g.can_skip = True
    g.load_state_dict(None, 0)  # a run's start
    response, noted, plan = respond(g, config)
    assert judged(g, calm(4) + [(5.0, 100.0)]) == [5]  # left out in the step
    assert response.after_check(plan, check(g, 5), 5).action == "skip"
    assert noted.notes == [UpdatesSkippedEvent((5,), 1, 5)]
    assert judged(g, [(float("nan"), 1.0)], first=6) == [6]
    assert response.after_check(plan, check(g, 6), 6).action == "no rollback target"
    assert noted.reports[-1] == ("no rollback target", (6,))
    assert noted.notes[-1] == UpdatesSkippedEvent((6,), 1, 6)
    behind = guard("rollback")  # a checkpoint lies behind the run (saved, or resumed from)
    behind.load_state_dict(g.state_dict(), 6)
    assert judged(behind, calm(8), first=7) == [] and judged(behind, [(5.0, 100.0)], first=15) == [15]
    assert behind.skip.item() == 1, "a single outlier's update reached the weights under rollback"


def test_rollback_goes_back_at_the_first_outlier_where_the_step_cannot_leave_its_update_out(tmp_path):
    """At ZeRO 1-3 the guard judges after DeepSpeed's update: the outlier's update is in the weights, and only a
    rollback takes it out again, so the first outlier rolls back whatever `rollback_after` says."""
    config = PretrainConfig(data=DataConfig(shards="s", tokenizer="t"), train=TrainConfig(
        spike_guard="rollback", output_dir=str(tmp_path / "run"), zero_stage=2), guard=GuardConfig(window=8,
                                                                                                 min_steps=4))
    g = guard("rollback")
    assert not g.can_skip
    response, noted, plan = respond(g, config)
    judged(g, calm(4) + [(5.0, 100.0)])
    assert response.after_check(plan, check(g, 5), 5).action == "no rollback target"  # no checkpoint yet
    assert noted.reports[-1] == ("no rollback target", (5,)) and noted.notes == []


def test_max_rollbacks_counts_the_rollbacks_of_one_spike():
    """A rollback belongs to the previous one's spike when its outliers come within a window of the range that one
    left out: a clean window between two spikes re-arms the bound."""
    ledger = Ledger(Path("l")).with_events([RollbackEvent(10, 10, (10,), 0, "step_00000008", 10),
                                            RollbackEvent(14, 14, (14,), 0, "step_00000012", 14)])
    assert spike_rollbacks(ledger, first=15, window=8) == 2  # 15 is 1 after 14, and 14 is 4 after 10
    assert spike_rollbacks(ledger, first=30, window=8) == 0  # 16 steps after: a clean window, a new spike
    assert spike_rollbacks(ledger, first=22, window=8) == 2 and spike_rollbacks(ledger, first=23, window=8) == 0


def test_an_fp16_overflow_is_left_to_the_loss_scaler():
    g = guard(precision="fp16")
    assert judged(g, calm(5) + [(5.0, float("inf")), (5.0, 100.0)]) == [7]


@pytest.mark.parametrize("scaled", [False, True], ids=["fp32-bf16", "fp16-grad-scaler"])
def test_the_verdict_leaves_the_whole_update_out_inside_fused_adamw(scaled):
    """`found_inf` is the verdict (fp32, bf16), or the verdict combined with fp16's GradScaler's own: either leaves the
    update out, and only an overflow moves the loss scale."""
    from pipeline.pretrain.step.deepspeed_patches import skip_updates_on

    param = torch.nn.Parameter(torch.ones(4))
    optimizer, verdict = torch.optim.AdamW([param], lr=0.1, fused=True), torch.zeros(())
    skip_updates_on(optimizer, verdict, scaled=scaled)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0) if scaled else None

    def step(grad: float, skip: bool) -> tuple[torch.Tensor, ...]:
        verdict.fill_(skip)
        param.grad = torch.full((4,), grad) if scaler is None else scaler.scale(torch.full((4,), grad))
        if scaler is None:
            optimizer.step()
        else:
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()
        state = optimizer.state[param]
        return param.detach().clone(), state["exp_avg"].clone(), state["step"].clone()

    before = step(1.0, skip=False)
    assert all(torch.equal(a, b) for a, b in zip(step(1e4, skip=True), before, strict=True))  # weights, moment, step
    assert scaler is None or scaler.get_scale() == 4.0  # a spike is not an overflow
    if scaler is not None:
        assert all(torch.equal(a, b) for a, b in zip(step(float("inf"), skip=False), before, strict=True))
        assert scaler.get_scale() == 2.0  # the overflow still halves the scale
    assert not torch.equal(step(1.0, skip=False)[0], before[0])


def test_the_window_is_in_the_checkpoint():
    g, other = guard(), guard()
    judged(g, calm(8))
    other.load_state_dict({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in g.state_dict().items()},
                          step=8)
    assert judged(g, [(5.0, 100.0)], first=9) == judged(other, [(5.0, 100.0)], first=9) == [9]
    fresh = guard(window=16)
    fresh.load_state_dict(g.state_dict(), step=8)  # another window length: it starts empty
    assert judged(fresh, [(5.0, 100.0)], first=9) == []


@pytest.mark.parametrize(("sets", "problem"), [
    (["train.spike_guard=skip", "train.zero_stage=1"],
     "train.spike_guard skip: an outlier's update is left out inside the optimizer's step (its found_inf), which "
     "only ZeRO stage 0 hands it, with torch's fused AdamW, LAMB or StableAdamW; got train.zero_stage 1; use "
     "train.spike_guard rollback"),
    (["train.spike_guard=skip", "optimizer.fused=false"], "got optimizer.fused false; use train.spike_guard rollback"),
    (["train.spike_guard=rollback", "checkpoint.keep_last=1"],
     "train.spike_guard rollback: an outlier is found up to guard.window 100 steps after it happened, and the "
     "rollback needs a checkpoint from before it; checkpoint.keep_last 1 at checkpoint.every 4 keeps none that old: "
     "raise checkpoint.keep_last to 26, or lower guard.window"),
    (["train.spike_guard=rollback", "checkpoint.keep_last=30", "checkpoint.resume=never"],
     "train.spike_guard rollback with checkpoint.resume never"),
    (["train.inject_spike=10x5"],
     "train.inject_spike: '10x5' is not STEP:FACTOR with STEP ≥ 1 and a factor other than 0"),
    (["train.inject_spike=10:0"], "train.inject_spike: '10:0' is not STEP:FACTOR"),
    (["guard.min_steps=200"], "guard.min_steps: must be ≤ guard.window 100, got 200"),
    (["guard.threshold=0"], "guard.threshold: must be a positive number of deviations, got 0"),
])
def test_the_config_refuses_a_guard_that_cannot_act(tmp_path, roberta_shards, bpe_tokenizer_dir, sets, problem):
    from pipeline.pretrain.preflight import load_pretrain_config

    config = write_config(tmp_path / "c.json", tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "x"))
    with pytest.raises(ConfigError) as refused:
        load_pretrain_config(config, sets, check_files=False)
    assert problem in str(refused.value)


def test_the_ledger_keeps_the_guards_events_and_skips_a_rollbacks_range(tmp_path):
    path = tmp_path / "ledger.jsonl"
    events = [SkipEvent(3, 3, 2), UpdatesSkippedEvent((12, 15), 2, 16), RollbackEvent(9, 20, (18,), 1, "step_00000008",
                                                                                       20),
              GaveUpEvent((30,), 0, "stopping", 31)]
    ledger = read_ledger(path).append(events)
    again = read_ledger(path)
    assert again.events == ledger.events and len(again.events) == 4
    assert again.skipped == (range(2, 3), range(8, 20)) and again.rollbacks == 1


def test_a_resume_leaves_a_rollbacks_range_out(tmp_path, roberta_shards, bpe_tokenizer_dir):
    """A rollback's range holds at every later resume, as a skip's: here an operator's `--skip-steps 3:3` goes back to
    step 2, before the guard's rollback (9-10), whose range the ledger keeps."""
    from helpers import record_at

    from pipeline.pretrain.checkpoints.record import write_record
    from pipeline.pretrain.checkpoints.storage import tag_for
    from pipeline.pretrain.preflight import prepare_run

    run = tmp_path / "run"
    for step, skipped in {2: (), 4: (), 8: (), 12: ((9, 10),)}.items():
        folder = PretrainLayout(run).checkpoints / tag_for(step)
        folder.mkdir(parents=True)
        write_record(folder, record_at(step, skipped=skipped))
    read_ledger(PretrainLayout(run).ledger).append([RollbackEvent(9, 10, (10,), 0, "step_00000008", 10)])
    config = write_config(tmp_path / "c.json", tiny_pretrain_config(
        roberta_shards, bpe_tokenizer_dir, run, train={"max_steps": 16}, checkpoint={"every": 2, "keep_last": 20}))
    assert prepare_run(config).skipped == (range(8, 10),)
    plan = prepare_run(config, ['train.skip_steps=["3:3"]'])
    assert plan.start.step == 2 and plan.skipped == (range(2, 3), range(8, 10))


@dataclass(frozen=True)
class Runs:
    """The harness's runs (tests/dist/spike_guard_runs.py) on `ranks` ranks, in `root`."""

    root: Path
    ranks: int

    def results(self, name: str) -> list[dict]:
        """Each rank's notes of run `name`."""
        return [json.loads((self.root / f"{name}-rank{r}.json").read_text()) for r in range(self.ranks)]

    def layout(self, name: str) -> PretrainLayout:
        return PretrainLayout(self.root / name)

    def ledger(self, name: str) -> list:
        return list(read_ledger(self.layout(name).ledger).events)

    def metrics(self, name: str) -> list[dict]:
        return [json.loads(line) for line in self.layout(name).metrics.read_text().splitlines()]


@pytest.fixture(scope="module", params=[1, 2], ids=["1-rank", "2-ranks"])
def runs(request, tmp_path_factory, roberta_shards, bpe_tokenizer_dir) -> Runs:
    root = tmp_path_factory.mktemp(f"spike-{request.param}")
    config = write_config(root / "config.json", tiny_pretrain_config(
        roberta_shards, bpe_tokenizer_dir, root / "x", data={"num_workers": 1, "cache_dir": str(root / "cache")},
        train={"max_steps": STEPS, "export": False}, checkpoint={"every": 4, "keep_last": 3},
        guard={"window": 8, "min_steps": 4}))
    launch(DEEPSPEED if request.param == 2 else [], "tests/dist/spike_guard_runs.py", config, root, timeout=900)
    return Runs(root, request.param)


def trained(result: dict) -> list[int]:
    """The steps a rank trained, in order (a step trained again after a rollback, twice)."""
    return [step for step, _ in result["trained"]]


def batch(result: dict, step: int) -> list[str]:
    """The digests of the sequences a rank last trained step `step` on."""
    return next(digests for s, digests in reversed(result["trained"]) if s == step)


@pytest.mark.slow
def test_skip_leaves_the_outliers_weights_moments_and_step_count_as_they_were(runs):
    for clean, skip in zip(runs.results("clean"), runs.results("skip"), strict=True):
        assert trained(skip) == trained(clean) == list(range(1, STEPS + 1))
        assert all(batch(skip, s) == batch(clean, s) for s in range(1, STEPS + 1))  # the data order moves on
        assert skip["changes"]["10"] == {"weights": 0.0, "exp_avg": 0.0, "exp_avg_sq": 0.0, "step": 0.0}
        assert min(skip["changes"]["9"].values()) > 0 and skip["changes"]["9"]["step"] == 1.0
    assert [e.steps for e in runs.ledger("skip") if isinstance(e, UpdatesSkippedEvent)] == [(10,)]
    assert [r["step"] for r in runs.metrics("skip") if "guard/skipped_updates" in r] == [10]
    from pipeline.commands.trace import trace_step

    sequences, notes = trace_step(runs.root / "skip", 10)
    assert len(sequences) == 16 and any("step 10's update was left out by the spike guard" in n for n in notes)


@pytest.mark.slow
def test_rollback_goes_back_leaves_the_spike_out_and_gives_up_after_its_bound(runs):
    """Spikes at 10, 14 and 15, `guard.max_rollbacks` 2."""
    for clean, rolled in zip(runs.results("clean"), runs.results("rollback"), strict=True):
        # back to 8 after 10: 9 again, 10 left out; on to 14, back to 12: 13 again, 14 left out; 15 stops it
        assert trained(rolled) == [*range(1, 11), 9, 11, 12, 13, 14, 13, 15]
        again = (9, 11, 12, 13, 15)  # every step trained after a rollback: its own batch and LR
        assert all(batch(rolled, s) == batch(clean, s) for s in again)
        assert all(rolled["lr"][str(s)] == pytest.approx(clean["lr"][str(s)]) for s in again)
        assert "after 2 rollbacks for this spike (guard.max_rollbacks 2" in rolled["gave_up"]
        assert "--skip-steps 15:15" in rolled["gave_up"] and "guard.max_rollbacks=3" in rolled["gave_up"]
    ledger = runs.ledger("rollback")
    assert [(type(e), e.at_step) for e in ledger] == [(RollbackEvent, 10), (RollbackEvent, 14), (GaveUpEvent, 15)]
    first, second, gave_up = ledger
    assert (first.first, first.last, first.outliers, first.to) == (10, 10, (10,), "step_00000008")
    assert (second.first, second.last, second.outliers, second.to) == (14, 14, (14,), "step_00000012")
    assert gave_up.outliers == (15,)
    assert read_record(runs.layout("rollback").checkpoints / "step_00000012").skipped == ((10, 10),)
    from pipeline.commands.trace import trace_step

    sequences, notes = trace_step(runs.root / "rollback", 10)  # the trace shows what was left out, and why
    assert len(sequences) == 16 and any("steps 10:10, left out by the spike guard's rollback to step_00000008 "
                                        "after outliers at steps 10" in n for n in notes)
    assert [(r["step"], r["guard/rollbacks"]) for r in runs.metrics("rollback") if "guard/rollbacks" in r] == [
        (10, 1), (14, 2)]


@pytest.mark.slow
def test_a_rerun_after_the_guard_gave_up_keeps_both_rollbacks_ranges_out(runs):
    """The ledger keeps both ranges; step 12's checkpoint, the start, knew only the first."""
    for clean, resumed in zip(runs.results("clean"), runs.results("rollback-resumed"), strict=True):
        assert trained(resumed) == [13, 15, 16]  # from step 12's checkpoint: 14 stays left out
        assert all(batch(resumed, s) == batch(clean, s) for s in (13, 15, 16))
    assert read_record(newest_complete(runs.layout("rollback-resumed").checkpoints)).skipped == ((10, 10), (14, 14))


@pytest.mark.slow
def test_rollback_after_two_outliers_goes_back_before_the_first_and_sets_later_checkpoints_aside(runs):
    """The first outlier's update never reaches the weights (left out as `skip` leaves it, a checkpoint behind the
    run); the second sends the run back."""
    for clean, rolled in zip(runs.results("clean"), runs.results("rollback-after-2"), strict=True):
        assert trained(rolled) == [*range(1, 15), 9, 15, 16]
        assert all(batch(rolled, s) == batch(clean, s) for s in (9, 15, 16))
        assert rolled["changes"]["10"] == {"weights": 0.0, "exp_avg": 0.0, "exp_avg_sq": 0.0, "step": 0.0}
        assert min(rolled["changes"]["9"].values()) > 0
    ledger = runs.ledger("rollback-after-2")
    assert [type(e) for e in ledger] == [UpdatesSkippedEvent, RollbackEvent, SetAsideEvent]
    assert ledger[0].steps == (10,)
    assert (ledger[1].first, ledger[1].last, ledger[1].outliers) == (10, 14, (10, 14))
    assert ledger[2].folder == "rolled-back-step_00000012"
    assert read_record(newest_complete(runs.layout("rollback-after-2").checkpoints)).skipped == ((10, 14),)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rollback", "rollback-after-2", "rollback-zero2"])
def test_a_step_trained_again_after_a_rollback_has_its_first_loss(runs, name):
    """The checkpoint's weights, moments and window come back exactly (ZeRO 2: its partitions, in the same
    process), so step 9, trained again from step 8's checkpoint, has the loss it had the first time."""
    losses: dict[int, list[float]] = {}
    for record in runs.metrics(name):
        if "train/loss" in record:
            losses.setdefault(record["step"], []).append(record["train/loss"])
    assert len(losses[9]) == 2 and losses[9][0] == losses[9][1], losses[9]
    if name == "rollback-zero2":
        for clean, rolled in zip(runs.results("clean"), runs.results(name), strict=True):
            assert trained(rolled) == [*range(1, 11), 9, *range(11, STEPS + 1)]
            assert all(batch(rolled, s) == batch(clean, s) for s in range(11, STEPS + 1))


@pytest.mark.slow
def test_two_spikes_a_clean_window_apart_are_each_rolled_back_and_a_nan_before_any_checkpoint_is_left_out(runs):
    """`guard.max_rollbacks` 1 bounds each spike, not the run. The NaN at step 3 has no checkpoint behind it to go
    back to: its update is left out and the run goes on."""
    for two in runs.results("two-spikes"):
        # 6: back to 4 (5 again, 6 left out); 15, a clean window after 6: back to 12 (13, 14 again, 15 left out)
        assert trained(two) == [*range(1, 7), 5, *range(7, 16), 13, 14, 16] and two["gave_up"] is None
    ledger = runs.ledger("two-spikes")
    assert [type(e) for e in ledger] == [UpdatesSkippedEvent, RollbackEvent, RollbackEvent]
    assert ledger[0].steps == (3,)
    assert [(e.first, e.last, e.to) for e in ledger[1:]] == [(6, 6, "step_00000004"), (15, 15, "step_00000012")]


@pytest.mark.slow
def test_a_change_of_level_at_a_resume_re_arms_the_window_rather_than_rolling_back(runs):
    """The resume changes the peak LR and every later loss is tripled: the window of the first session's level would
    call each step an outlier and roll back, again and again, to a checkpoint of that level."""
    for shifted in runs.results("level-shift-resumed"):
        assert trained(shifted) == list(range(9, 17)) and shifted["gave_up"] is None
    assert runs.ledger("level-shift") == []
