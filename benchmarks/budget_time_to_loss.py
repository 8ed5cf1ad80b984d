"""Time to 1.0 nat below the unigram plateau: the budget recipe against HF Trainer on the same model.

docs/benchmarks.md ("The budget recipe against HF") says how each runs and is timed; `--out`'s results.json keeps
every curve and each run's load."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import harness
import hf_baselines

BUDGET_CONFIG = "configs/budget-modernbert.json"
RANKS = 2
"""The budget recipe's ranks: 2 ranks × 1 thread ran 4.7× the tokens/s of 1 process × 2 threads on 2 shared cores."""
MARGINS = (1.0, 1.5)
"""The losses timed: nats below the unigram entropy H; the headline's target is the first."""
TARGET_MARGIN = MARGINS[0]
EVAL_EVERY_SEQUENCES, EVAL_SEQUENCES, THREADS = 320, 128, 2
"""An evaluation every 320 training sequences, of 128 fixed validation sequences; CPU threads per run."""
GOALS = {"hf-same": 2.0, "hf-run_mlm": 5.0}
"""How many times sooner than each HF recipe the budget recipe must reach H − TARGET_MARGIN."""
STUDY = harness.Study("budget_time_to_loss", question="How soon does the budget recipe leave the plateau?",
                      metric="training minutes to H − 1.0 and H − 1.5 nats (median over seeds)",
                      baseline="HF Trainer on the same model: the same recipe (hf-same) and run_mlm.py's defaults "
                               "(hf-run_mlm)", arms=("budget", *hf_baselines.RECIPES))


def recipe_config(a: argparse.Namespace, shards: Path, tokenizer: Path):
    """The budget config (also both HF recipes' model, and hf-same's recipe), checked as the trainer checks it."""
    from pipeline.pretrain.preflight import load_pretrain_config

    return load_pretrain_config(harness.ROOT / a.budget_config,
                                [*a.set, f"data.shards={shards}", f"data.tokenizer={tokenizer}"], world_size=RANKS,
                                check_files=False)


def run_one(recipe: str, seed: int, a: argparse.Namespace, tokenizer: Path, shards: Path) -> dict:
    """One run of `recipe` under `seed`: its evaluation curve, steps, batch and the load averages around it."""
    from pipeline.tracking.loss_curve import EvalPoint, curve_from_metrics

    folder = a.out / "runs" / f"{recipe}-seed{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config = recipe_config(a, shards, tokenizer)
    model = f"{config.model.architecture} {config.model.num_hidden_layers} × {config.model.hidden_size}"
    launched, extra = time.time(), {}
    if recipe in hf_baselines.RECIPES:
        spec = {"recipe": recipe, "config": str(harness.ROOT / a.budget_config), "overrides": a.set, "ranks": RANKS,
                "launched_at": launched, "max_minutes": a.max_minutes, "seed": seed, "tokenizer": str(tokenizer),
                "shards": str(shards), "cache_dir": str(a.out / "token_cache"), "eval_sequences": EVAL_SEQUENCES,
                "eval_every_sequences": EVAL_EVERY_SEQUENCES, "out": str(folder / "trainer"),
                "result": str(folder / "result.json")}
        # The worker stops itself at the cap (after the step); the launch's cap is a backstop.
        run = harness.launch([sys.executable, __file__, "--hf-worker", json.dumps(spec)],
                             env=harness.cpu_env(THREADS), log=folder / "log.txt", cap_minutes=a.max_minutes + 5)
        result = json.loads((folder / "result.json").read_text())
        curve, steps, batch = [EvalPoint(**p) for p in result["curve"]], result["steps"], result["batch"]
        extra = {k: result[k] for k in ("model_class", "parameters", "differences")}
    else:
        batch = config.train.global_batch_size
        sets = [f"data.shards={shards}", f"data.tokenizer={tokenizer}", f"data.cache_dir={a.out / 'token_cache'}",
                f"train.output_dir={folder}", f"train.seed={seed}", "train.log_every=1", "train.export=false",
                f"train.eval_every={max(1, EVAL_EVERY_SEQUENCES // batch)}", f"train.eval_sequences={EVAL_SEQUENCES}",
                "checkpoint.every=1000000000", "checkpoint.resume=never", "tracking.enabled=false", *a.set]
        run = harness.launch(harness.pretrain_command(a.budget_config, sets, RANKS), log=folder / "log.txt",
                             env=harness.cpu_env(max(1, THREADS // RANKS)), cap_minutes=a.max_minutes)
        records = harness.metrics(folder)  # none when the cap came before the first logged step
        curve = curve_from_metrics(records, launched)
        steps = max((r["step"] for r in records if "train/loss" in r), default=0)
    return {"recipe": recipe, "seed": seed, "model": model, "steps": steps, "batch": batch,
            "wall_seconds": round(run.seconds, 1), "load_before": run.load_before, "load_after": run.load_after,
            "overrides": a.set, **extra, "curve": [vars(p) for p in curve]}


def margin_label(margin: float | str) -> str:
    """`H − 1.0`: the unigram entropy less a margin, the margin as Python writes the float."""
    return f"H − {float(margin)}"


def margin_targets(entropy: float) -> dict[str, float]:
    """The losses to time: the unigram entropy less each margin, keyed by the margin as written (`"1.0"`)."""
    return {str(m): entropy - m for m in MARGINS}


def time_to(curve: list, target: float) -> dict:
    """When `curve` (EvalPoints) first reaches `target`; if it never does, its last evaluation's step and training
    seconds, lower bounds (0 for a run that never evaluated)."""
    from pipeline.tracking.loss_curve import first_crossing

    hit = first_crossing(curve, target)
    if hit is not None:
        return {"step": hit.step, "seconds": hit.seconds, "reached": True}
    last = curve[-1] if curve else None
    return {"step": last.step if last else 0, "seconds": last.seconds if last else 0.0, "reached": False}


def median_time(hits: list[dict]) -> dict:
    """The median over seeds of `time_to` answers, an unreached run later than every reached one (they share the
    cap); where the median run did not reach it, the median of the runs' bounds, a lower bound."""
    inf = float("inf")
    seconds = statistics.median([h["seconds"] if h["reached"] else inf for h in hits])
    step = statistics.median([h["step"] if h["reached"] else inf for h in hits])
    reached = sum(h["reached"] for h in hits)
    if seconds != inf:
        return {"step": step, "seconds": seconds, "exact": True, "reached": reached, "runs": len(hits)}
    return {"step": statistics.median(h["step"] for h in hits), "exact": False, "reached": reached,
            "seconds": statistics.median(h["seconds"] for h in hits), "runs": len(hits)}


def time_cell(median: dict, max_minutes: float) -> str:
    """`1,204, 3.10 min (3/3)`, or `not reached in 8 min (0/3): > 7.52 min`."""
    counts = f"({median['reached']}/{median['runs']})"
    if median["exact"]:
        return f"{median['step']:,.0f}, {median['seconds'] / 60:.2f} min {counts}"
    return f"not reached in {max_minutes:g} min {counts}: > {median['seconds'] / 60:.2f} min"


def time_ratio(recipe: dict, budget: dict) -> dict:
    """`recipe` ÷ `budget` median times (`median_time` answers): exact, a bound (≥ where the recipe did not reach the
    target, ≤ where the budget did not), or not measurable."""
    kind = {(True, True): "exact", (False, True): "at least", (True, False): "at most"}.get(
        (recipe["exact"], budget["exact"]))
    if kind is None or budget["seconds"] <= 0:
        why = "neither reached it" if kind is None else "the budget recipe's time is 0"
        return {"value": None, "kind": None, "text": f"not measurable: {why}"}
    value = recipe["seconds"] / budget["seconds"]
    prefix = {"exact": "", "at least": "≥ ", "at most": "≤ "}[kind]
    return {"value": value, "kind": kind, "text": f"{prefix}{value:.1f}×"}


def goal_met(ratio: dict, goal: float) -> bool | None:
    """Whether a `time_ratio` shows "≥ goal × sooner": yes, no, or None where a bound cannot tell."""
    value, kind = ratio["value"], ratio["kind"]
    if kind == "exact":
        return value >= goal
    if kind == "at least" and value >= goal:
        return True
    return False if kind == "at most" and value < goal else None


def summarise(runs: list[dict], entropy: float, max_minutes: float) -> tuple[dict, list[dict]]:
    """Per recipe and margin, the median time to H − margin over seeds; the ratios to the budget; the table's rows."""
    from pipeline.pretrain.report.plateau import beside_plateau
    from pipeline.tracking.loss_curve import EvalPoint

    targets, headline_margin = margin_targets(entropy), str(TARGET_MARGIN)
    recipes: dict = {}
    for run in runs:
        curve = [EvalPoint(**p) for p in run["curve"]]
        row = recipes.setdefault(run["recipe"], {"model": run["model"], "batch": run["batch"], "seeds": [],
                                                 "final_loss": [], "steps": [], "hits": {m: [] for m in targets}})
        row["seeds"].append(run["seed"])
        row["final_loss"].append(curve[-1].loss if curve else None)
        row["steps"].append(run["steps"])
        for m, target in targets.items():
            row["hits"][m].append(time_to(curve, target))
    for row in recipes.values():
        row["median"] = {m: median_time(hits) for m, hits in row["hits"].items()}
    ratios, verdicts = {}, {}
    if "budget" in recipes:
        budget = recipes["budget"]["median"][headline_margin]
        for name, row in recipes.items():
            if name != "budget":
                ratios[name] = time_ratio(row["median"][headline_margin], budget)
                if name in GOALS:
                    verdicts[name] = {"goal": GOALS[name], "met": goal_met(ratios[name], GOALS[name])}
    rows = []
    for name, row in recipes.items():
        finals = [x for x in row["final_loss"] if x is not None]
        rows.append({
            "recipe": name, "model": row["model"], "batch": row["batch"], "seeds": ",".join(map(str, row["seeds"])),
            **{f"to {margin_label(m)} = {t:.3f} nats: steps, min (reached)": time_cell(row["median"][m], max_minutes)
               for m, t in targets.items()},
            "final val loss (median)":
                beside_plateau(statistics.median(finals), entropy) if finals else "no evaluation",
            "steps run (median)": f"{statistics.median(row['steps']):,.0f}",
            f"time to {margin_label(headline_margin)} ÷ budget": ratios[name]["text"] if name in ratios else "—"})
    summary = {"unigram_entropy": entropy, "targets": targets, "ratio_margin": headline_margin,
               "recipes": {name: {k: v for k, v in row.items() if k != "hits"} | {"runs_to": row["hits"]}
                           for name, row in recipes.items()},
               "ratios": ratios, "goals": verdicts}
    return summary, rows


def record_variant(recipes: list[str], budget_config: str = BUDGET_CONFIG) -> str | None:
    """All three recipes on the default budget config write budget_time_to_loss; a subset of them, or another
    budget config, is its own variant, so it cannot overwrite that record."""
    parts = [] if sorted(recipes) == sorted(STUDY.arms) else ["-vs-".join(recipes)]
    if (harness.ROOT / budget_config).resolve() != (harness.ROOT / BUDGET_CONFIG).resolve():
        parts.append(Path(budget_config).stem)
    return ".".join(parts) or None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipes", default=",".join(STUDY.arms), help=f"comma list of {', '.join(STUDY.arms)}")
    p.add_argument("--budget-config", default=BUDGET_CONFIG,
                   help="the budget recipe's config (also hf-same's recipe and both HF recipes' model)")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--baseline-seeds", default=None, help="seeds of every recipe but budget (default: --seeds)")
    p.add_argument("--max-minutes", type=float, default=7.0, help="wall-clock cap per run, from its launch")
    p.add_argument("--set", action="append", default=[], metavar="budget:KEY=VALUE",
                   help="override a key of the budget config, e.g. budget:optimizer.lr=0.002 (for all recipes)")
    p.add_argument("--out", type=Path, default=None, help="data and runs (default: a work folder, not runs/)")
    p.add_argument("--hf-worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.hf_worker:
        return hf_baselines.worker(json.loads(a.hf_worker))
    recipes = a.recipes.split(",")
    problems = [f"unknown recipe {r}" for r in recipes if r not in STUDY.arms]
    problems += [f"--set {s}: give budget:KEY=VALUE" for s in a.set if not s.startswith("budget:")]
    problems += [] if harness.IMDB.exists() else [f"needs {harness.IMDB}"]
    problems += [] if (harness.ROOT / a.budget_config).exists() else [f"--budget-config {a.budget_config}: missing"]
    if problems:
        p.error("; ".join(problems))
    a.set = [s.split(":", 1)[1] for s in a.set]
    with STUDY.record(record_variant(recipes, a.budget_config)) as rec:
        measure(a, recipes, rec)


def measure(a: argparse.Namespace, recipes: list[str], rec: harness.BenchmarkRecord) -> None:
    from pipeline.pretrain.report.plateau import plateau_level

    a.out = harness.work_dir("budget-time-to-loss", a.out)
    tokenizer, shards = harness.cli_data(a.out, [harness.IMDB], val_fraction=0.01, env=harness.cpu_env())
    entropy = plateau_level(shards, tokenizer)
    print(f"unigram entropy of the validation tokens (the plateau's level): {entropy:.3f} nats", flush=True)
    seeds = [int(s) for s in a.seeds.split(",")]
    baseline_seeds = [int(s) for s in (a.baseline_seeds or a.seeds).split(",")]
    runs = []
    for recipe in recipes:  # seeds inside recipes: the budget's seeds finish first if time runs short
        for seed in seeds if recipe == "budget" else baseline_seeds:
            runs.append(run_one(recipe, seed, a, tokenizer, shards))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "curve"}), flush=True)
            (a.out / "results.json").write_text(json.dumps({"unigram_entropy": entropy, "runs": runs}, indent=1))
    summary, rows = summarise(runs, entropy, a.max_minutes)
    loads = [r["load_before"][0] for r in runs] + [r["load_after"][0] for r in runs]
    conditions = (f"{len(runs)} runs, cap {a.max_minutes:g} min each, threads per run {THREADS}; budget config "
                  f"{a.budget_config}; 75000 IMDB reviews; 1-min load average "
                  f"{min(loads):.2f}–{max(loads):.2f} around the runs")
    (a.out / "results.json").write_text(json.dumps({"runs": runs, "summary": summary,
                                                    "args": {k: str(v) for k, v in vars(a).items()}}, indent=1))
    rec.table(f"{conditions}; medians over seeds; unigram entropy H = {entropy:.3f} nats", rows,
              note="Times are training minutes from launch (evaluation left out), interpolated between "
                   "evaluations; a run that did not reach a target is bounded by its last evaluation's time.")
    rec.results["unigram_entropy_nats"] = entropy
    rec.results["targets_nats"] = summary["targets"]
    differences = {r["recipe"]: r["differences"] for r in runs if r.get("differences")}
    if differences:
        rec.results["hf_recipe_differences"] = differences
    for name, verdict in summary["goals"].items():
        rec.headline(f"{name} ÷ budget, time to {margin_label(TARGET_MARGIN)}", summary["ratios"][name]["text"],
                     target=f"≥ {verdict['goal']:g}×", met=verdict["met"])


if __name__ == "__main__":
    main()
