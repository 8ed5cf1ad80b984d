"""Batch-size warmup: time to 1.0 nat below the unigram plateau with and without it, at the same total tokens.

    python benchmarks/batch_warmup.py [--config configs/budget-modernbert.json] [--seeds 1,2,3]
        [--warmup-fraction 0.1] [--start-divisor 4] [--max-minutes 7] [--documents 0] [--corpus FILE]
        [--set KEY=VALUE ...] [--out DIR]

1. Tokenizer and 128-token shards from the IMDB corpus, made once in `--out`, and the plateau H
   (the unigram entropy of the validation tokens), as benchmarks/budget_time_to_loss.py makes them.
2. Two variants of the config, each under every seed, on 2 ranks × 1 thread:
   - full-batch: the config as written (max_steps × global batch sequences);
   - batch-warmup: `train.batch_warmup_tokens` = `--warmup-fraction` of the full-batch run's tokens,
     starting at global batch ÷ `--start-divisor`, and `train.max_steps` raised until the run draws at least
     as many sequences as the full-batch one (the same total tokens; the LR schedule counts steps).
   Both run at a micro batch small enough for the start to hold one per rank.
3. Each run's validation curve against training wall time (evaluation left out,
   pipeline/tracking/loss_curve.py), evaluated every `--eval-every-sequences` sequences at full
   batch; the time to H − 1.0 is interpolated between evaluations. A run stops at its schedule's
   end or at `--max-minutes` from its launch.
Output: `results.json` and `table.md` in `--out`, and benchmarks/results/batch_warmup.json.
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
sys.path.insert(0, str(ROOT / "benchmarks"))
import budget_time_to_loss as budget  # noqa: E402
from result_record import BenchmarkRecord, write_loss_table  # noqa: E402

RANKS = 2
MARGIN = 1.0
"""Time to this many nats below the unigram entropy."""


def load(config: str, sets: list[str]):
    from pipeline.pretrain.preflight import load_pretrain_config

    return load_pretrain_config(ROOT / config, sets, world_size=RANKS, check_files=False)


def steps_for_sequences(config, seq_len: int, sequences: int) -> int:
    """The fewest steps of `config`'s batch warmup that draw at least `sequences` sequences."""
    from pipeline.pretrain.batch_plan import batch_ramp

    t = config.train
    drawn, steps = 0, 0
    for segment in batch_ramp(t.global_batch_size, t.batch_warmup_start, t.batch_warmup_tokens, seq_len,
                              max_steps=sequences):  # at most one sequence per step: a bound
        for _ in range(segment.start, segment.end):
            if drawn >= sequences:
                return steps
            drawn += segment.global_batch_size
            steps += 1
    return steps


def pretrain_run(folder: Path, config: str, sets: list[str], a, deadline_minutes: float,
                 extra_args: list[str] = ()) -> dict:
    """One capped `launchers/pretrain.py` run on RANKS ranks into `folder`: its records, curve and load averages."""
    from pipeline.tracking.loss_curve import curve_from_metrics

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    env = budget.launch_environment()
    env["OMP_NUM_THREADS"] = str(max(1, a.threads // RANKS))
    args = [x for s in sets for x in ("--set", s)]
    load_before, launched = os.getloadavg(), time.time()
    budget.run_capped([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(RANKS),
                       "launchers/pretrain.py", "--config", config, *args, *extra_args], env,
                      launched + 60 * deadline_minutes, folder / "log.txt")
    metrics = folder / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    curve = curve_from_metrics(records, launched)
    return {"steps": max((r["step"] for r in records if "train/loss" in r), default=0),
            "wall_seconds": round(time.time() - launched, 1), "load_before": load_before,
            "load_after": os.getloadavg(), "curve": [vars(p) for p in curve],
            "final_loss": curve[-1].loss if curve else None}


def common_sets(a, shards: Path, tokenizer: Path, folder: Path, seed: int, batch: int) -> list[str]:
    return [f"data.shards={shards}", f"data.tokenizer={tokenizer}", f"data.cache_dir={a.out / 'token_cache'}",
            f"train.output_dir={folder}", f"train.seed={seed}", "train.log_every=1", "train.export=false",
            f"train.eval_every={max(1, a.eval_every_sequences // batch)}", f"train.eval_sequences={a.eval_sequences}",
            "checkpoint.resume=never", "tracking.enabled=false", *a.set]


def prepare(a) -> tuple[Path, Path, float]:
    """Data made once in `--out`, the comm op built before any clock starts, and the plateau H."""
    from pipeline.pretrain.plateau import plateau_level

    budget.CORPUS = a.corpus
    if not a.corpus.exists():
        raise SystemExit(f"needs {a.corpus} (--corpus)")
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    tokenizer, shards = budget.prepare_data(a.out, {**os.environ, "PYTHONPATH": str(ROOT)}, a.documents)
    budget.build_comm_op()
    entropy = plateau_level(shards, tokenizer)
    print(f"unigram entropy of the validation tokens (the plateau's level): {entropy:.3f} nats", flush=True)
    return tokenizer, shards, entropy


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", default=budget.BUDGET_CONFIG)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--max-minutes", type=float, default=7.0, help="wall-clock cap per run, from its launch")
    p.add_argument("--documents", type=int, default=0, help="first N reviews only (0: all); a fresh --out")
    p.add_argument("--corpus", type=Path, default=budget.CORPUS)
    p.add_argument("--eval-every-sequences", type=int, default=320)
    p.add_argument("--eval-sequences", type=int, default=128)
    p.add_argument("--threads", type=int, default=2, help="CPU threads per run (split between ranks)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    return p


def main() -> None:
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--warmup-fraction", type=float, default=0.1, help="share of the run's tokens the warmup spans")
    p.add_argument("--start-divisor", type=int, default=4, help="the warmup starts at global batch ÷ this")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "batch-warmup")
    a = p.parse_args()
    with BenchmarkRecord("batch_warmup", argv=sys.argv) as rec:
        measure(a, rec)


def measure(a, rec: BenchmarkRecord) -> None:
    from pipeline.data.shard_index import load_index
    from pipeline.tracking.loss_curve import EvalPoint

    tokenizer, shards, entropy = prepare(a)
    seq_len = load_index(shards)["seq_len"]
    t = load(a.config, a.set).train
    sequences = t.max_steps * t.global_batch_size
    start = t.global_batch_size // a.start_divisor
    # The start must hold a whole micro batch per rank: a smaller micro batch where needed, in both variants
    # (the same arithmetic per step, so the comparison stays fair).
    micro = min(t.micro_batch_size, max(1, start // RANKS))
    if start < RANKS or start % (micro * RANKS) or t.global_batch_size % start:
        raise SystemExit(f"--start-divisor {a.start_divisor}: a start of {start} sequences does not split into "
                         f"{RANKS} ranks' micro batches and divide the global batch {t.global_batch_size}")
    a.set = [*a.set, f"train.micro_batch_size={micro}"]
    warmup = [f"train.batch_warmup_tokens={int(a.warmup_fraction * sequences * seq_len)}",
              f"train.batch_warmup_start={start}"]
    warm_steps = steps_for_sequences(load(a.config, [*a.set, *warmup]), seq_len, sequences)
    variants = {"full-batch": [], "batch-warmup": [*warmup, f"train.max_steps={warm_steps}"]}
    target = entropy - MARGIN
    runs = []
    for name, sets in variants.items():
        for seed in [int(s) for s in a.seeds.split(",")]:
            folder = a.out / "runs" / f"{name}-seed{seed}"
            run = pretrain_run(folder, a.config, [*common_sets(a, shards, tokenizer, folder, seed, t.global_batch_size),
                                                  *sets], a, a.max_minutes)
            curve = [EvalPoint(**point) for point in run["curve"]]
            run.update(variant=name, seed=seed, to_target=budget.time_to(curve, target))
            runs.append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "curve"}), flush=True)
    rows = []
    for name in variants:
        mine = [r for r in runs if r["variant"] == name]
        median = budget.median_time([r["to_target"] for r in mine])
        finals = [r["final_loss"] for r in mine if r["final_loss"] is not None]
        rows.append({"variant": name, "max_steps": t.max_steps if name == "full-batch" else warm_steps,
                     f"to {budget.margin_label(MARGIN)} = {target:.3f} nats: steps, min (reached)":
                         budget.time_cell(median, a.max_minutes),
                     "final val loss (median)": f"{statistics.median(finals):.3f}" if finals else "no evaluation"})
    loads = [x for r in runs for x in (r["load_before"][0], r["load_after"][0])]
    conditions = (f"{len(runs)} runs on {RANKS} ranks, cap {a.max_minutes:g} min each; config {a.config}; "
                  f"{sequences:,} sequences of {seq_len} tokens per run; warmup over {a.warmup_fraction:g} of them "
                  f"from global batch {start}; micro batch {micro}; "
                  f"1-min load average {min(loads):.2f}–{max(loads):.2f}")
    write_loss_table(rec, a.out, entropy, runs, rows, conditions,
                     note="Times are training minutes from launch (evaluation left out), interpolated "
                          "between evaluations; medians over seeds.")


if __name__ == "__main__":
    main()
