"""Annealing from a checkpoint against runs planned for that length from the start: final validation loss.

    python benchmarks/anneal_from_checkpoint.py [--config configs/budget-modernbert.json] [--seeds 1,2,3]
        [--lengths 0.5,0.75] [--decay-fraction 0.2] [--decay linear] [--documents 0] [--corpus FILE]
        [--set KEY=VALUE ...] [--out DIR]

The promise of annealing (ModernBERT's decay phase, Ettin's phases): one stable run at constant
LR serves every length; a run of length L is its checkpoint at L − D plus a decay of D steps, and
should end as well as a run planned for L from the start.

1. Data and the plateau H as benchmarks/budget_time_to_loss.py makes them (128-token IMDB shards).
2. Per seed, on 2 ranks × 1 thread, with the config's budget T = `train.max_steps`:
   - stable: `schedule.decay=constant` (warmup, then the peak LR), checkpoints at every S = L − D;
   - anneal-L: `launchers/pretrain.py --anneal-from stable/checkpoints/step_S --anneal-steps D`, the
     decay `--decay` to `schedule.end_lr_ratio`, for each L in `--lengths` × T and D = `--decay-fraction` × L;
   - planned-L: the config's own schedule with `train.max_steps` = L.
3. The final validation loss of each (the end-of-run evaluation, same validation sequences and
   masks for all, at the config's masking rate). Per length: the gap anneal − planned (median over
   seeds) beside the seeds' spread (max − min of the planned runs' final losses).
Output: `results.json` and `table.md` in `--out`, and benchmarks/results/anneal_from_checkpoint.json.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from batch_warmup import common_sets, load, parser, prepare, pretrain_run  # noqa: E402
from result_record import BenchmarkRecord, write_loss_table  # noqa: E402


def main() -> None:
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--lengths", default="0.5,0.75", help="run lengths as fractions of the config's train.max_steps")
    p.add_argument("--decay-fraction", type=float, default=0.2, help="share of each length spent decaying")
    p.add_argument("--decay", default="linear", help="the anneal's schedule.decay")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "anneal-from-checkpoint")
    a = p.parse_args()
    with BenchmarkRecord("anneal_from_checkpoint", argv=sys.argv) as rec:
        measure(a, rec)


def measure(a, rec: BenchmarkRecord) -> None:
    tokenizer, shards, entropy = prepare(a)
    base = load(a.config, a.set)
    budget_steps, batch = base.train.max_steps, base.train.global_batch_size
    lengths = {f: round(float(f) * budget_steps) for f in a.lengths.split(",")}
    decays = {f: max(1, round(a.decay_fraction * n)) for f, n in lengths.items()}
    starts = {f: lengths[f] - decays[f] for f in lengths}
    every = math.gcd(*starts.values())
    runs = []

    def run(name: str, seed: int, sets: list[str], extra: list[str] = ()) -> dict:
        folder = a.out / "runs" / f"{name}-seed{seed}"
        # Evaluated once, at the end (train.eval_every 0): the final loss is the measure.
        result = pretrain_run(folder, a.config, [*common_sets(a, shards, tokenizer, folder, seed, batch),
                                                 "train.eval_every=0", *sets], a, a.max_minutes, list(extra))
        result.update(run=name, seed=seed)
        runs.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "curve"}), flush=True)
        return result

    for seed in [int(s) for s in a.seeds.split(",")]:
        stable = a.out / "runs" / f"stable-seed{seed}"
        run("stable", seed, ["schedule.decay=constant", f"train.max_steps={max(starts.values())}",
                             f"checkpoint.every={every}", "checkpoint.keep_last=1000"])
        for f in lengths:
            run(f"anneal-{f}", seed, [f"schedule.decay={a.decay}", "checkpoint.every=1000000000"],
                ["--anneal-from", str(stable / "checkpoints" / f"step_{starts[f]:08d}"),
                 "--anneal-steps", str(decays[f])])
            run(f"planned-{f}", seed, [f"train.max_steps={lengths[f]}", "checkpoint.every=1000000000"])
    rows = []
    for f in lengths:
        planned = {r["seed"]: r["final_loss"] for r in runs if r["run"] == f"planned-{f}"}
        annealed = {r["seed"]: r["final_loss"] for r in runs if r["run"] == f"anneal-{f}"}
        both = [s for s in planned if planned[s] is not None and annealed.get(s) is not None]
        if not both:
            continue
        gap = statistics.median(annealed[s] - planned[s] for s in both)
        spread = max(planned[s] for s in both) - min(planned[s] for s in both)
        rows.append({"length (steps)": f"{lengths[f]:,} ({f} of {budget_steps:,})",
                     "anneal: from step, decay steps": f"{starts[f]:,}, {decays[f]:,}",
                     "planned final val loss (median)": f"{statistics.median(planned[s] for s in both):.3f}",
                     "anneal final val loss (median)": f"{statistics.median(annealed[s] for s in both):.3f}",
                     "gap anneal − planned (median)": f"{gap:+.3f}", "seeds' spread (planned)": f"{spread:.3f}",
                     "within the spread": "yes" if abs(gap) <= spread else "no"})
    loads = [x for r in runs for x in (r["load_before"][0], r["load_after"][0])]
    conditions = (f"{len(runs)} runs on 2 ranks; config {a.config}; seeds {a.seeds}; anneal decay {a.decay} to "
                  f"schedule.end_lr_ratio {base.schedule.end_lr_ratio}; validation at masking rate "
                  f"{base.masking.probability}; 1-min load average {min(loads):.2f}–{max(loads):.2f}")
    write_loss_table(rec, a.out, entropy, runs, rows, conditions,
                     note="Final validation MLM loss after each run's last step; the gap is the median "
                          "over seeds of anneal − planned for the same seed.")


if __name__ == "__main__":
    main()
