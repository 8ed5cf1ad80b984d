"""ModernBERT against pre-LN RoBERTa on IMDB at the same parameter count: tokens/s, time off the plateau, MFU.

    python benchmarks/architecture_race.py [--max-minutes 10] [--seeds 1] [--documents 0]
        [--arms roberta-prelayernorm,modernbert] [--set ARM:KEY=VALUE ...] [--out DIR]

In one run, on 2 CPU ranks × 1 thread each (the budget recipe's layout):
1. A 16k byte-level BPE tokenizer and 128-token `full` shards of the IMDB reviews
   (../shared/data/corpus/imdb-reviews.jsonl.zst), made once in `--out` by the user-facing
   commands; `--documents N` takes the first N reviews only (smoke runs).
2. The plateau: the unigram entropy H of the validation tokens (pipeline/pretrain/plateau.py,
   special tokens excluded); the target is a validation MLM loss of H − 1.0 nats.
3. Each arm trains configs/budget-tiny.json's recipe (2 layers, hidden 128, 4 heads; LR 2e-3 on a
   triangular schedule, batch 32, 15% masking for both arms, so their losses compare) with its own
   architecture: `roberta-prelayernorm` (GELU feed-forward 512) and `modernbert` (GeGLU 341, 2/3 of
   the width: the same parameters within a few per cent; one global layer, one with the published
   128-token window). Each run is capped at `--max-minutes` of wall time from its launch.
4. Per arm: parameters, median training tokens/s (padding excluded, both ranks), the time to H − 1.0
   (wall time from launch less evaluation time, interpolated between evaluations:
   pipeline/tracking/loss_curve.py), and MFU = tokens/s × model FLOPs per token
   (pipeline/pretrain/flops.py: GeGLU's third matrix and the window counted) ÷ the fp32 `torch.mm`
   peak of 2 threads measured in the same run. CPU SDPA computes every score of a windowed layer
   (the window is a mask), so ModernBERT's MFU counts less work than the CPU does.
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
# The one capped launch (SIGTERM at the deadline) and the one way these races make their data.
from budget_time_to_loss import (  # noqa: E402
    CORPUS,
    build_comm_op,
    launch_environment,
    median_time,
    prepare_data,
    run_capped,
    time_ratio,
    time_to,
)

from benchmarks.matmul_peak import peak_flops  # noqa: E402
from benchmarks.result_record import BenchmarkRecord  # noqa: E402

BASE = "configs/budget-tiny.json"
ARMS = {"roberta-prelayernorm": ["model.architecture=roberta-prelayernorm"],
        "modernbert": ["model.architecture=modernbert", "model.intermediate_size=341"]}
MARGIN = 1.0
"""Nats below the unigram entropy that count as off the plateau."""
RANKS = 2


def arm_shape(arm: str, overrides: list[str], tokenizer: Path) -> tuple[int, float, float]:
    """(parameters, training FLOPs per token, masking probability) of an arm's model, built as the trainer builds it."""
    from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
    from pipeline.pretrain.flops import model_flops_per_token
    from pipeline.pretrain.model import build_model
    from pipeline.pretrain.preflight import load_pretrain_config

    config = load_pretrain_config(ROOT / BASE, [*ARMS[arm], *overrides, "data.shards=x", "data.tokenizer=x"],
                                  world_size=RANKS, check_files=False)
    model = build_model(config.model, describe_tokenizer(load_tokenizer(str(tokenizer))), 128)
    probability = config.masking.probability
    return (sum(p.numel() for p in model.parameters()), model_flops_per_token(model.config, 128, probability),
            probability)


def run_arm(arm: str, seed: int, a, tokenizer: Path, shards: Path, overrides: list[str]) -> dict:
    """One capped pretraining run of `arm`: its evaluation curve and logged tokens/s."""
    from pipeline.tracking.loss_curve import curve_from_metrics

    folder = a.out / "runs" / f"{arm}-seed{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    batch = 32
    sets = [*ARMS[arm], f"data.shards={shards}", f"data.tokenizer={tokenizer}", f"data.cache_dir={a.out / 'cache'}",
            f"train.output_dir={folder}", f"train.seed={seed}", "train.log_every=5", "train.export=false",
            f"train.eval_every={max(1, a.eval_every_sequences // batch)}", f"train.eval_sequences={a.eval_sequences}",
            "checkpoint.every=1000000000", "checkpoint.resume=never", "tracking.enabled=false", *overrides]
    env = {**launch_environment(), "OMP_NUM_THREADS": "1"}
    load_before, launched = os.getloadavg(), time.time()
    run_capped([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(RANKS), "launchers/pretrain.py",
                "--config", BASE, *(x for s in sets for x in ("--set", s))], env, launched + 60 * a.max_minutes,
               folder / "log.txt")
    metrics = folder / "metrics.jsonl"  # absent when the cap came before the first logged step
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return {"arm": arm, "seed": seed, "load_before": load_before, "load_after": os.getloadavg(),
            "wall_seconds": round(time.time() - launched, 1),
            "steps": max((r["step"] for r in records if "train/loss" in r), default=0),
            "tokens_per_s": [r["train/tokens_per_s"] for r in records if r.get("train/tokens_per_s")][1:] or
                            [r["train/tokens_per_s"] for r in records if r.get("train/tokens_per_s")],
            "curve": [vars(p) for p in curve_from_metrics(records, launched)]}


def summarise(runs: list[dict], shapes: dict, target: float, plateau: float, peak: float, cap: float) -> list[dict]:
    from pipeline.tracking.loss_curve import EvalPoint, first_crossing

    rows = []
    for arm, (parameters, flops, probability) in shapes.items():
        mine = [r for r in runs if r["arm"] == arm]
        speeds = [statistics.median(r["tokens_per_s"]) for r in mine if r["tokens_per_s"]]
        crossings = [first_crossing([EvalPoint(**p) for p in r["curve"]], target) for r in mine]
        reached = [c.seconds for c in crossings if c is not None]
        tokens_per_s = statistics.median(speeds) if speeds else None
        rows.append({
            "arm": arm, "parameters": parameters, "masking": probability, "seeds": len(mine),
            "tokens_per_s": round(tokens_per_s, 1) if tokens_per_s else None,
            "minutes_to_target": round(statistics.median(reached) / 60, 2) if len(reached) == len(mine) else None,
            "reached": f"{len(reached)}/{len(mine)} within {cap:g} min",
            "final_val_loss": statistics.median(r["curve"][-1]["loss"] for r in mine) if all(
                r["curve"] for r in mine) else None,
            "flops_per_token": round(flops), "mfu": round(tokens_per_s * flops / peak, 4) if tokens_per_s else None})
    return rows


def margins_over_time(runs: list[dict], plateau: float, minutes: list[float]) -> list[dict]:
    """Per run, the margin below the plateau at the last evaluation by each of `minutes` (training time)."""
    rows = []
    for r in runs:
        row = {"arm": r["arm"], "seed": r["seed"]}
        for m in minutes:
            done = [p["loss"] for p in r["curve"] if p["seconds"] <= 60 * m]
            row[f"{m:g} min"] = round(plateau - done[-1], 3) if done else None
        rows.append(row)
    return rows


def record_findings(rec: BenchmarkRecord, runs: list[dict], rows: list[dict], plateau: float) -> None:
    """The margin-over-time table, each run's conditions, and the headline: how much sooner ModernBERT leaves.

    The ratio is budget_time_to_loss's: exact, or a bound from the last evaluation's training time of
    an arm that did not reach the target (never from the wall-clock cap, which includes evaluations).
    """
    from pipeline.tracking.loss_curve import EvalPoint

    rec.table("nats below the unigram entropy at the last evaluation by each training minute (launch included, "
              "evaluation left out); the copy floor is ~0.6", margins_over_time(runs, plateau, [1, 2, 3, 4, 6, 8, 10]))
    rec.table("runs", [{"arm": r["arm"], "seed": r["seed"], "steps": r["steps"], "wall s": r["wall_seconds"],
                        "load before → after": f"{r['load_before'][0]:.2f} → {r['load_after'][0]:.2f}"} for r in runs])
    times = {arm: median_time([time_to([EvalPoint(**p) for p in r["curve"]], plateau - MARGIN)
                               for r in runs if r["arm"] == arm]) for arm in {r["arm"] for r in runs}}
    if {"modernbert", "roberta-prelayernorm"} <= times.keys():
        ratio = time_ratio(times["roberta-prelayernorm"], times["modernbert"])
        rec.headline(f"time to H − {MARGIN:.1f}, pre-LN RoBERTa ÷ ModernBERT", ratio["text"])
    speeds = {r["arm"]: r["tokens_per_s"] for r in rows}
    fast, slow = speeds.get("modernbert"), speeds.get("roberta-prelayernorm")
    if fast and slow:
        rec.headline("tokens/s, ModernBERT ÷ pre-LN RoBERTa", f"{fast / slow:.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arms", default="roberta-prelayernorm,modernbert")
    p.add_argument("--seeds", default="1")
    p.add_argument("--max-minutes", type=float, default=10.0, help="wall-clock cap per run, from its launch")
    p.add_argument("--documents", type=int, default=0, help="first N reviews only (0: all 75,000)")
    p.add_argument("--vocab-size", type=int, default=16000)
    p.add_argument("--eval-every-sequences", type=int, default=640)
    p.add_argument("--eval-sequences", type=int, default=128)
    p.add_argument("--set", action="append", default=[], metavar="ARM:KEY=VALUE",
                   help="override a key of one arm's config, e.g. modernbert:model.local_attention=64")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "architecture-race")
    a = p.parse_args()
    arms, seeds = a.arms.split(","), [int(s) for s in a.seeds.split(",")]
    bad = [x for x in arms if x not in ARMS] + [s for s in a.set if s.split(":", 1)[0] not in ARMS]
    if bad or not CORPUS.exists():
        raise SystemExit(f"unknown arms or --set prefixes {bad}, or no corpus at {CORPUS}")
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    from pipeline.pretrain.plateau import plateau_level

    with BenchmarkRecord("architecture_race", sys.argv) as rec:
        tokenizer, shards = prepare_data(a.out, {**os.environ, "PYTHONPATH": str(ROOT)}, a.documents, a.vocab_size)
        plateau = plateau_level(shards, tokenizer)
        target = plateau - MARGIN
        overrides = {arm: [s.split(":", 1)[1] for s in a.set if s.split(":", 1)[0] == arm] for arm in arms}
        shapes = {arm: arm_shape(arm, overrides[arm], tokenizer) for arm in arms}
        build_comm_op()  # before any clock starts, so no arm's time includes a compile
        peak = peak_flops(RANKS, n=2048)  # 2 ranks × 1 thread: the peak of the same 2 cores
        runs = [run_arm(arm, seed, a, tokenizer, shards, overrides[arm]) for seed in seeds for arm in arms]
        rows = summarise(runs, shapes, target, plateau, peak, a.max_minutes)
        loads = [x for r in runs for x in (r["load_before"][0], r["load_after"][0])]
        lines = [f"IMDB ({a.documents or 75_000} reviews), 2 ranks × 1 thread, cap {a.max_minutes:g} min per run; "
                 f"unigram entropy {plateau:.3f} nats, target {target:.3f}; fp32 mm peak {peak / 1e9:.1f} GFLOP/s; "
                 f"1-min load {min(loads):.2f}–{max(loads):.2f}", "",
                 "| arm | parameters | tokens/s | min to H − 1.0 | reached | final val loss | MFU |",
                 "|---|---|---|---|---|---|---|"]
        for r in rows:
            minutes = "not reached" if r["minutes_to_target"] is None else r["minutes_to_target"]
            final = "–" if r["final_val_loss"] is None else f"{r['final_val_loss']:.3f}"
            mfu = "–" if r["mfu"] is None else f"{r['mfu']:.1%}"
            lines.append(f"| {r['arm']} | {r['parameters']:,} | {r['tokens_per_s'] or '–'} | {minutes} | "
                         f"{r['reached']} | {final} | {mfu} |")
        table = "\n".join(lines)
        print(table)
        rec.table(f"IMDB ({a.documents or 75_000} reviews), 2 ranks × 1 thread, cap {a.max_minutes:g} min per run, "
                  f"unigram entropy {plateau:.3f} nats, target {target:.3f}", rows,
                  note=f"fp32 mm peak {peak / 1e9:.1f} GFLOP/s on 2 threads, measured in the run; MFU counts the "
                       "model's FLOPs (pipeline/pretrain/flops.py)")
        record_findings(rec, runs, rows, plateau)
        rec.results.update({"unigram_entropy_nats": plateau, "target_nats": target, "peak_flops": peak})
        (a.out / "results.json").write_text(json.dumps({"runs": runs, "rows": rows}, indent=1))  # every curve
        (a.out / "table.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
