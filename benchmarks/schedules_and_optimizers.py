"""WSD against linear decay, and StableAdamW against AdamW at the budget recipe's LR and 3× it, on IMDB.

    python benchmarks/schedules_and_optimizers.py [--budget-config configs/budget-modernbert.json]
        [--parts schedules,optimizers] [--seeds 1,2,3] [--optimizer-seeds 1] [--steps 0]
        [--wsd-decay 1-sqrt] [--wsd-decay-fraction 0.2] [--lr-multiples 1,3] [--eval-mask-rate 0.15]
        [--documents 0] [--corpus IMDB.jsonl.zst] [--ranks 2] [--max-minutes 20] [--set KEY=VALUE ...] [--out DIR]

In one run, on `--ranks` CPU ranks × 1 thread each (the budget recipe's layout):
1. A 16k byte-level BPE tokenizer and 128-token shards of the IMDB reviews, made once in `--out` by
   the user-facing commands (budget_time_to_loss.prepare_data; `--documents N`: the first N only).
2. schedules: the budget config as shipped (linear decay after its warmup) against the same config
   with `schedule.kind wsd` (`--wsd-decay` over the last `--wsd-decay-fraction` of the steps), the
   same model, data, seeds and steps (`--steps`, 0: the config's). Per seed, the final validation
   MLM loss; the gap (WSD − linear) beside the spread of the seeds.
3. optimizers: `optimizer.name adamw` against `stableadamw` at `--lr-multiples` × the config's LR.
   Per run, the final validation loss and the spikes: optimizer steps whose training loss exceeds
   the step before by more than 0.5 nats (every step is logged). A run whose loss became non-finite
   stops there (the trainer refuses to go on) and is reported as diverged at that step.
Every run validates at `masking.eval_probability = --eval-mask-rate` on the same fixed sequences, so
the losses compare; the tables name the rate. Output: `results.json` and `table.md` in `--out`, and
benchmarks/results/schedules_and_optimizers.json through result_record.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import budget_time_to_loss  # noqa: E402
from budget_time_to_loss import BUDGET_CONFIG, CORPUS, build_comm_op, launch_environment, prepare_data, run_capped  # noqa: E402
from result_record import BenchmarkRecord, markdown_table  # noqa: E402

SPIKE_NATS = 0.5
"""A loss spike: a step's training loss above the previous step's by more than this."""


def count_spikes(losses: dict[int, float], threshold: float = SPIKE_NATS) -> int:
    """Steps whose training loss exceeds the previous logged step's by more than `threshold` nats."""
    steps = sorted(losses)
    return sum(losses[b] - losses[a] > threshold for a, b in zip(steps, steps[1:], strict=False))


def arms(a: argparse.Namespace, lr: float) -> list[tuple[str, str, list[str]]]:
    """(part, arm name, config overrides) of every arm the chosen parts run."""
    out = []
    if "schedules" in a.parts:
        out.append(("schedules", "linear", ["schedule.kind=warmup-decay", "schedule.decay=linear"]))
        out.append(("schedules", f"wsd-{a.wsd_decay}", ["schedule.kind=wsd", f"schedule.decay={a.wsd_decay}",
                                                        f"schedule.decay_fraction={a.wsd_decay_fraction}"]))
    if "optimizers" in a.parts:
        for multiple in a.lr_multiples:
            for name in ("adamw", "stableadamw"):
                out.append(("optimizers", f"{name}-lr-x{multiple:g}", [f"optimizer.name={name}",
                                                                       f"optimizer.lr={lr * multiple:g}"]))
    return out


def run_one(part: str, arm: str, seed: int, sets: list[str], a, tokenizer: Path, shards: Path) -> dict:
    """One launch of the budget config with `sets`: its step losses, evaluations, and how it ended."""
    folder = a.out / "runs" / f"{arm}-seed{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    overrides = [f"data.shards={shards}", f"data.tokenizer={tokenizer}", f"data.cache_dir={a.out / 'token_cache'}",
                 f"train.output_dir={folder}", f"train.seed={seed}", "train.log_every=1", "train.export=false",
                 f"masking.eval_probability={a.eval_mask_rate}", "checkpoint.every=1000000000",
                 "checkpoint.resume=never", "tracking.enabled=false", *a.set, *sets]
    if a.steps:
        overrides.append(f"train.max_steps={a.steps}")
    env = {**launch_environment(), "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable] if a.ranks == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                       "--nproc_per_node", str(a.ranks)]
    load_before, launched = os.getloadavg(), time.time()
    ended = "finished"
    try:
        run_capped([*launcher, "launchers/pretrain.py", "--config", a.budget_config,
                    *[x for s in overrides for x in ("--set", s)]], env, launched + 60 * a.max_minutes,
                   folder / "log.txt")
    except SystemExit:  # a non-finite loss ends the run with an error; anything else is a real failure
        if "the training loss is" not in (folder / "log.txt").read_text():
            raise
        ended = "diverged"
    metrics = folder / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    losses = {r["step"]: r["train/loss"] for r in records if "train/loss" in r}
    evaluations = [r for r in records if "eval/mlm_loss" in r]
    final = evaluations[-1] if evaluations and ended == "finished" else None
    return {"part": part, "arm": arm, "seed": seed, "overrides": sets, "ended": ended,
            "steps": max(losses, default=0), "final_val_loss": final["eval/mlm_loss"] if final else None,
            "eval_mask_rate": final.get("eval/mask_rate") if final else None, "spikes": count_spikes(losses),
            "wall_seconds": round(time.time() - launched, 1), "load_before": load_before,
            "load_after": os.getloadavg(), "train_losses": losses}


def spread(values: list[float]) -> str:
    return f"{min(values):.3f}–{max(values):.3f}" if values else "—"


def schedule_rows(runs: list[dict]) -> list[dict]:
    """Per schedule arm: final validation losses per seed, their median and range; then the gap to linear."""
    by_arm: dict[str, list[dict]] = {}
    for r in runs:
        if r["part"] == "schedules":
            by_arm.setdefault(r["arm"], []).append(r)
    rows, medians = [], {}
    for arm, group in by_arm.items():
        finals = [r["final_val_loss"] for r in group if r["final_val_loss"] is not None]
        medians[arm] = statistics.median(finals) if finals else None
        rows.append({"schedule": arm, "seeds": ", ".join(str(r["seed"]) for r in group),
                     "final validation loss per seed": ", ".join("—" if r["final_val_loss"] is None else
                                                                 f"{r['final_val_loss']:.3f}" for r in group),
                     "median": "—" if medians[arm] is None else f"{medians[arm]:.3f}", "range": spread(finals)})
    if "linear" in medians and medians["linear"] is not None:
        for row in rows:
            m = medians[row["schedule"]]
            row["median − linear"] = "—" if m is None else f"{m - medians['linear']:+.3f}"
    return rows


def optimizer_rows(runs: list[dict]) -> list[dict]:
    """Per optimizer run: how it ended, its final validation loss, and its loss spikes."""
    return [{"optimizer × LR": r["arm"], "seed": r["seed"], "ended": r["ended"] if r["ended"] == "finished" else
             f"diverged at step {r['steps']}", "final validation loss": "—" if r["final_val_loss"] is None else
             f"{r['final_val_loss']:.3f}", f"spikes > {SPIKE_NATS:g} nats": r["spikes"], "steps": r["steps"]}
            for r in runs if r["part"] == "optimizers"]


def markdown(rows: list[dict]) -> str:
    """Rows of named columns as a markdown table."""
    return "\n".join(markdown_table(rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budget-config", default=BUDGET_CONFIG)
    p.add_argument("--parts", default="schedules,optimizers", help="comma list of schedules, optimizers")
    p.add_argument("--seeds", default="1,2,3", help="seeds of the schedule comparison")
    p.add_argument("--optimizer-seeds", default="1", help="seeds of the optimizer comparison")
    p.add_argument("--steps", type=int, default=0, help="train.max_steps of every run (0: the config's)")
    p.add_argument("--wsd-decay", default="1-sqrt", choices=["linear", "cosine", "1-sqrt"])
    p.add_argument("--wsd-decay-fraction", type=float, default=0.2)
    p.add_argument("--lr-multiples", default="1,3", help="multiples of the config's optimizer.lr")
    p.add_argument("--eval-mask-rate", type=float, default=0.15, help="masking.eval_probability of every run")
    p.add_argument("--documents", type=int, default=0, help="first N reviews only (0: all 75,000); a fresh --out")
    p.add_argument("--corpus", type=Path, default=CORPUS, help="the IMDB reviews (.jsonl.zst)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--max-minutes", type=float, default=20.0, help="wall-clock cap per run, from its launch")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every run")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "schedules-and-optimizers")
    a = p.parse_args()
    a.parts = a.parts.split(",")
    a.lr_multiples = [float(m) for m in a.lr_multiples.split(",")]
    if not a.corpus.exists():
        raise SystemExit(f"needs {a.corpus} (--corpus)")
    budget_time_to_loss.CORPUS = a.corpus  # prepare_data reads the corpus it names
    if set(a.parts) - {"schedules", "optimizers"}:
        raise SystemExit(f"--parts: schedules and/or optimizers, got {a.parts}")
    with BenchmarkRecord("schedules_and_optimizers", argv=sys.argv) as rec:
        measure(a, rec)


def measure(a: argparse.Namespace, rec: BenchmarkRecord) -> None:
    from pipeline.pretrain.plateau import plateau_level
    from pipeline.pretrain.preflight import load_pretrain_config

    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    tokenizer, shards = prepare_data(a.out, {**os.environ, "PYTHONPATH": str(ROOT)}, a.documents)
    entropy = plateau_level(shards, tokenizer)
    config = load_pretrain_config(ROOT / a.budget_config, a.set, world_size=a.ranks, check_files=False)
    build_comm_op()
    runs = []
    for part, arm, sets in arms(a, config.optimizer.lr):
        for seed in [int(s) for s in (a.seeds if part == "schedules" else a.optimizer_seeds).split(",")]:
            runs.append(run_one(part, arm, seed, sets, a, tokenizer, shards))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "train_losses"}), flush=True)
            (a.out / "results.json").write_text(json.dumps({"unigram_entropy": entropy, "runs": runs}, indent=1))
    steps = a.steps or config.train.max_steps
    loads = [r["load_before"][0] for r in runs] + [r["load_after"][0] for r in runs]
    conditions = (f"budget config {a.budget_config}, {steps} steps, {a.ranks} ranks × 1 thread; "
                  f"{a.documents or 75_000} IMDB reviews; validation loss at {100 * a.eval_mask_rate:g}% masking "
                  f"(unigram entropy {entropy:.3f} nats); 1-min load average {min(loads):.2f}–{max(loads):.2f}")
    lines = [conditions]
    if "schedules" in a.parts:
        rows = schedule_rows(runs)
        rec.table(f"WSD ({a.wsd_decay} over the last {a.wsd_decay_fraction:g} of the steps) against linear decay: "
                  f"final validation MLM loss at {100 * a.eval_mask_rate:g}% masking; {conditions}", rows)
        lines.append(markdown(rows))
    if "optimizers" in a.parts:
        rows = optimizer_rows(runs)
        rec.table(f"StableAdamW against AdamW at {', '.join(f'{m:g}' for m in a.lr_multiples)} × LR "
                  f"{config.optimizer.lr:g}: final validation MLM loss at {100 * a.eval_mask_rate:g}% masking and "
                  f"loss spikes; {conditions}", rows)
        lines.append(markdown(rows))
    rec.results["unigram_entropy_nats"] = entropy
    rec.results["eval_mask_rate"] = a.eval_mask_rate
    (a.out / "table.md").write_text("\n\n".join(lines) + "\n")
    print("\n\n".join(lines))


if __name__ == "__main__":
    main()
