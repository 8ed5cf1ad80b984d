"""What the spike guard does about a planted spike (`train.inject_spike`), guard off, `skip` and `rollback` (going back
at the first outlier, and with the default `guard.rollback_after` 2, where a single outlier is only left out), against
a clean run; what it does under `rollback` when a run is resumed with a second corpus in its mix (a lasting change of
level, not a spike: it must go on); and what it costs the main job's step. docs/long-runs.md ("The spike guard")
says what it shows.

    python benchmarks/spike_guard.py [--steps 400] [--spike 250:1e3] [--repeats 6] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import ROOT, SHARED, BenchmarkRecord, Study, cpu_env, launch, metrics, pretrain_command, work_dir

from pipeline.commands import run_default as job
from pipeline.common.run_layout import MainJobLayout, PretrainLayout
from pipeline.pretrain.checkpoints.ledger import RollbackEvent, UpdatesSkippedEvent, read_ledger
from pipeline.pretrain.checkpoints.storage import newest_complete, verified_checkpoint

CONFIG = "configs/main-job.json"
ARMS = ("clean", "spike, guard off", "spike, skip", "spike, rollback", "spike, rollback, one outlier",
        "clean, clipped at 1.0", "spike, guard off, clipped at 1.0")
SECOND_CORPUS = SHARED / "corpus" / "shakespeare"
"""The corpus a resumed run adds to its mix: Gutenberg's Shakespeare, far from the main job's docstrings."""
SKIP_TARGET, COST_TARGET = 0.01, 0.03
STUDY = Study(
    "spike_guard", question="Does the spike guard undo a planted spike, and what does it cost a step?",
    metric="final validation loss against the clean run's; the batches after a rollback; the main job's step time",
    baseline=f"the clean run (no spike, guard off); targets: skip within {SKIP_TARGET:.0%} of its final validation "
             f"loss, the guard at most {COST_TARGET:.0%} of the main job's step time", arms=ARMS)


def arm_sets(arm: str, spike: str) -> list[str]:
    """Each arm's overrides. Unclipped, the planted gradient reaches AdamW whole; clipped, it is cut back to the clip
    norm along its own direction, and read against the clean run clipped alike (clipping changes the run too)."""
    guard = {"spike, skip": "skip", "spike, rollback": "rollback", "spike, rollback, one outlier": "rollback"}.get(
        arm, "off")
    # One planted outlier: the `rollback` arm goes back at the first; the one-outlier arm keeps the default
    # guard.rollback_after 2, so its single outlier is only left out, as `skip` leaves it, and never rolled back.
    once = ["guard.rollback_after=1"] if arm == "spike, rollback" else []
    return ([] if arm.startswith("clean") else [f"train.inject_spike={spike}"]) + [f"train.spike_guard={guard}"] + (
        [] if "clipped" in arm else ["train.gradient_clipping=0"]) + once


def evals(run: Path) -> dict[int, tuple[float, float]]:
    """{step: (validation loss, unigram entropy H)}."""
    return {r["step"]: (r["eval/mlm_loss"], r["eval/unigram_entropy"]) for r in metrics(run) if "eval/mlm_loss" in r}


def guard_did(run: Path) -> str:
    """What the run's ledger says the guard did."""
    said = {UpdatesSkippedEvent: lambda e: f"update of step {', '.join(map(str, e.steps))} left out",
            RollbackEvent: lambda e: f"back to {e.to}, steps {e.first}:{e.last} left out"}
    return "; ".join(said[type(e)](e) for e in read_ledger(PretrainLayout(run).ledger).events if type(e) in said)


def train(command: list[str], run: Path) -> float:
    """Train into a fresh `run` folder; the seconds it took."""
    shutil.rmtree(run, ignore_errors=True)  # a folder left by an earlier run would make this one resume
    return launch(command, env=cpu_env(1), log=run.with_suffix(".log")).seconds


def same_batches(clean: Path, rolled: Path, steps: range) -> bool:
    """Whether each of `steps` (1-based) draws the same sequences in both runs, as their records (and traces) say."""
    from pipeline.pretrain.preflight import recorded_plan

    drawn = [[str(p.stretch_at(s - 1).stream(p.config.train.seed).step_sequences(s - 1)[:2]) for s in steps]
             for p in (recorded_plan(clean), recorded_plan(rolled))]
    return drawn[0] == drawn[1]


def spike_arms(rec: BenchmarkRecord, out: Path, data: list[str], steps: int, spike: str) -> None:
    at = int(spike.split(":")[0])
    common = [*data, f"train.max_steps={steps}", "train.export=false", "tracking.enabled=false",
              "checkpoint.every=100", "checkpoint.keep_last=2", "train.eval_every=50"]
    runs, rows = {arm: out / arm.replace(", ", "-").replace(" ", "-") for arm in ARMS}, []
    seconds = {arm: train(pretrain_command(CONFIG, [*common, f"train.output_dir={run}", *arm_sets(arm, spike)]), run)
               for arm, run in runs.items()}
    for arm, run in runs.items():
        curve, clean = evals(run), evals(runs["clean, clipped at 1.0" if "clipped" in arm else "clean"])
        after = [curve[s][0] - clean[s][0] for s in curve if s > at and s in clean]
        rows.append({"arm": arm, "final val loss (H)": f"{curve[steps][0]:.3f} ({curve[steps][1]:.3f})",
                     "final vs clean": f"{curve[steps][0] / clean[steps][0] - 1:+.2%}",
                     f"mean gap after step {at}, nats": round(statistics.mean(after), 3) if after else None,
                     "the guard (its ledger)": guard_did(run) or "—", "wall s": round(seconds[arm])})
    rec.table(f"the main job's recipe, {steps} steps on 1 rank, a spike planted at step {at}", rows,
              note="val loss: eval/mlm_loss at the last step; H: the validation tokens' unigram entropy (the "
                   "plateau); gap: the arm's validation loss minus the clean run's (clipped alike) at each evaluation "
                   "after the spike")
    final = {arm: evals(run)[steps][0] for arm, run in runs.items()}
    off = final["spike, guard off"] - final["clean"]
    rec.headline("spike, guard off: final validation loss above the clean run's",
                 f"{off:+.3f} nats ({off / final['clean']:+.1%})")
    skip = final["spike, skip"] / final["clean"] - 1
    rec.headline("spike, skip: final validation loss against the clean run's", f"{skip:+.2%}",
                 target=f"within {SKIP_TARGET:.0%}", met=abs(skip) <= SKIP_TARGET)
    rec.headline("spike, rollback: what it did on its own", guard_did(runs["spike, rollback"]) or "no rollback")
    last = max((e.last for e in read_ledger(PretrainLayout(runs["spike, rollback"]).ledger).events
                if isinstance(e, RollbackEvent)), default=steps)
    rec.headline(f"spike, rollback: the batches of steps {last + 1}-{steps} are the clean run's",
                 same_batches(runs["clean"], runs["spike, rollback"], range(last + 1, steps + 1)))
    back = final["spike, rollback"] / final["clean"] - 1
    rec.headline("spike, rollback: final validation loss against the clean run's", f"{back:+.2%}",
                 target=f"within {SKIP_TARGET:.0%}", met=abs(back) <= SKIP_TARGET)
    one = runs["spike, rollback, one outlier"]
    rec.headline("spike, rollback with guard.rollback_after 2 (one outlier): what it did", guard_did(one) or "nothing")
    single = final["spike, rollback, one outlier"] / final["clean"] - 1
    rec.headline("spike, rollback with guard.rollback_after 2 (one outlier): final validation loss against the clean "
                 "run's", f"{single:+.2%}", target=f"within {SKIP_TARGET:.0%}, no rollback",
                 met=abs(single) <= SKIP_TARGET and not any(isinstance(e, RollbackEvent) for e in read_ledger(
                     PretrainLayout(one).ledger).events))


def mix_change(rec: BenchmarkRecord, out: Path, layout: MainJobLayout, steps: int) -> None:
    """Under `rollback`, the main job's recipe stopped (SIGUSR1, as a requeue) past half its steps and resumed with
    Shakespeare beside its corpus, 1:1: the loss's level moves for good, and the guard must follow it, not roll back."""
    second = out / "shakespeare-shards"
    launch([sys.executable, "data_prep/shard.py", "--input", SECOND_CORPUS, "--tokenizer", layout.tokenizer,
            "--seq-len", job.SEQ_LEN, "--val-fraction", "0.05", "--shard-size", "1024", "--workers", "2", "--out",
            second], env=cpu_env(), log=out / "shakespeare-shards.log")
    run = out / "mix-change"
    shutil.rmtree(run, ignore_errors=True)
    common = [f"data.tokenizer={layout.tokenizer}", f"train.output_dir={run}", f"train.max_steps={steps}",
              "train.export=false", "tracking.enabled=false", "checkpoint.every=100", "checkpoint.keep_last=2",
              "train.eval_every=50", "train.spike_guard=rollback"]
    with open(out / "mix-change-1.log", "w") as log:
        first = subprocess.Popen(pretrain_command(CONFIG, [f"data.shards={layout.shards}", *common]), cwd=ROOT,
                                 env=cpu_env(1), stdout=log, stderr=subprocess.STDOUT)
        while first.poll() is None and not any(r["step"] >= steps // 2 for r in metrics(run, "train/loss")):
            time.sleep(0.5)
        first.send_signal(signal.SIGUSR1)  # stops after the step, with a checkpoint
        assert first.wait() == 0, (out / "mix-change-1.log").read_text()[-3000:]
    _, record = verified_checkpoint(newest_complete(PretrainLayout(run).checkpoints))
    stopped_at = record.step  # the step the signal's checkpoint holds (logs come every 5 steps)
    mix = json.dumps([{"path": str(layout.shards), "weight": 1}, {"path": str(second), "weight": 1}])
    launch(pretrain_command(CONFIG, [f"data.shards={mix}", *common]), env=cpu_env(1), log=out / "mix-change-2.log")
    losses = {r["step"]: r["train/loss"] for r in metrics(run, "train/loss")}
    before = statistics.mean(v for s, v in losses.items() if stopped_at - 25 < s <= stopped_at)  # 5 logs each
    after = statistics.mean(v for s, v in losses.items() if stopped_at < s <= stopped_at + 25)
    said = "the spike guard's window starts again" in (out / "mix-change-2.log").read_text()
    rec.table("rollback, a run resumed with a second corpus in its mix (the main job's recipe, 1 rank)", [
        {"stopped at step": stopped_at, "train loss, 25 steps before": round(before, 3),
         "train loss, 25 steps after": round(after, 3), "the window started again (its log)": said,
         "the guard (its ledger)": guard_did(run) or "—", "reached step": max(losses)}])
    rec.headline("rollback, a mix change at a resume: the run goes on without a rollback",
                 not guard_did(run) and max(losses) == steps, target="no rollback, every step trained",
                 met=not guard_did(run) and max(losses) == steps)


def cost(rec: BenchmarkRecord, out: Path, data: list[str], steps: int, repeats: int) -> None:
    """The main job's step time (2 ranks, its recipe), guard off and `skip`, in pairs run in turn (each pair meets
    the same load from the machine's other tenants); read as the median of the pairs' ratios."""
    times: dict[str, list[float]] = {"off": [], "skip": []}
    for i in range(repeats):
        for mode, values in (times.items() if i % 2 == 0 else reversed(times.items())):
            run = out / f"cost-{mode}-{i}"
            train(pretrain_command(CONFIG, [*data, f"train.output_dir={run}", f"train.max_steps={steps}",
                                            "train.eval_every=0", "train.export=false", "tracking.enabled=false",
                                            f"train.spike_guard={mode}"], ranks=2), run)
            # the median of the logged windows' milliseconds a step (16 sequences), past the first 20 steps
            values.append(statistics.median(1e3 * 16 / r["train/samples_per_s"] for r in metrics(run)
                                            if "train/samples_per_s" in r and r["step"] > 20))
    ratios = [on / off for on, off in zip(times["skip"], times["off"], strict=True)]
    rec.table(f"the main job's step time, ms ({steps} steps on 2 ranks; {repeats} pairs, in turn)",
              [*({"run": mode, **{f"pair {i + 1}": round(t, 1) for i, t in enumerate(values)}}
                 for mode, values in times.items()),
               {"run": "skip ÷ off", **{f"pair {i + 1}": round(r, 3) for i, r in enumerate(ratios)}}])
    ratio = statistics.median(ratios) - 1
    rec.headline("the guard's cost per step (skip against off, the main job; median of the pairs)", f"{ratio:+.1%}",
                 target=f"≤ {COST_TARGET:.0%}", met=ratio <= COST_TARGET)
    alone = guard_work_ms()  # the pairs' spread hides a cost this small: its own work, timed alone
    rec.headline("the guard's own work a step (its loss and judgement, timed alone on one rank)",
                 f"{alone:.2f} ms, {alone / statistics.median(times['off']):.2%} of the step with it off")


def guard_work_ms(steps: int = 2000) -> float:
    """Milliseconds a step of the guard's work (the main job's guard, one rank), after 100 steps of warm-up."""
    import torch

    from pipeline.pretrain.guard.spike_guard import SpikeGuard
    from pipeline.pretrain.preflight import load_pretrain_config

    config = load_pretrain_config(ROOT / CONFIG, ["train.spike_guard=skip"], check_files=False)
    guard, loss, norm, started = SpikeGuard(config, "cpu", 1), torch.tensor(5.0), torch.tensor(1.0), 0.0
    for step in range(-100, steps):
        started = time.perf_counter() if step == 0 else started
        guard.loss(step, [loss])
        guard.judge(norm)
    return 1e3 * (time.perf_counter() - started) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--spike", default="250:1e3", help="the drill, STEP:FACTOR")
    p.add_argument("--cost-steps", type=int, default=150)
    p.add_argument("--repeats", type=int, default=6, help="pairs of runs, guard off and on, for the cost")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    out = work_dir("spike-guard", a.out)
    (layout := MainJobLayout(out / "data")).root.mkdir(parents=True, exist_ok=True)
    job.make_data(job.MainJob(layout.root, verbose=False), layout, workers=2)
    with STUDY.record() as rec:
        data = [f"data.shards={layout.shards}", f"data.tokenizer={layout.tokenizer}"]
        spike_arms(rec, out, data, a.steps, a.spike)
        mix_change(rec, out, layout, a.steps)
        cost(rec, out, data, a.cost_steps, a.repeats)


if __name__ == "__main__":
    main()
