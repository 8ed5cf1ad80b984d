"""Time to 1.0 nat below the unigram plateau: the budget recipe against HF Trainer on the same model.

    python benchmarks/budget_time_to_loss.py [--recipes budget,hf-same,hf-run_mlm] [--seeds 1,2,3]
        [--baseline-seeds 1] [--max-minutes 7] [--margins 1.0,1.5]
        [--budget-config configs/budget-modernbert.json] [--documents 0] [--set RECIPE:KEY=VALUE ...] [--out DIR]

Measured: whether the pipeline with the budget recipe reaches a validation MLM loss 1.0 nat
below the unigram entropy ≥ 2× sooner than HF `Trainer` with the same model and recipe (the
pipeline's own efficiency), and ≥ 5× sooner than HF `run_mlm`'s defaults on the same model size.

1. A 16k byte-level BPE tokenizer and 128-token shards from the IMDB corpus (../shared/data), made
   once in `--out` by the user-facing commands; `--documents N` takes the first N reviews only
   (smoke runs; use a fresh `--out`).
2. The plateau: the unigram entropy H of the validation tokens (pipeline/pretrain/plateau.py's
   `plateau_level`). The targets are H − margin for each of `--margins`; every loss is printed
   with its margin below H.
3. Each recipe and seed runs in its own process until its schedule ends or `--max-minutes` of wall
   time from its launch pass (then it stops after the step):
   - budget:     `launchers/pretrain.py --config <--budget-config>` on 2 ranks × 1 thread;
   - hf-same:    HF `Trainer`, one process, on the same transformers class and config as the
                 budget recipe's model, with the same recipe (benchmarks/hf_baselines.py says
                 what "same" covers, and the results list what still differs);
   - hf-run_mlm: HF `Trainer` with `run_mlm.py`'s defaults on the same model size and architecture
                 (`hf` is accepted for it);
   - tiny:       `configs/tiny.json` on 2 ranks, its max_steps set to the budget recipe's horizon in
                 sequences (not run by default).
   `--set budget:KEY=VALUE` changes the budget config for budget, hf-same and hf-run_mlm alike.
4. Every recipe is evaluated on the same validation sequences with the same masks: the first
   `--eval-sequences` of the validation split, masked by the pipeline's hashed masker under the
   run's seed and the budget config's masking section (tiny: its own), every
   `--eval-every-sequences` training sequences. The HF runs are evaluated from a callback.
5. Time is wall time from the process's launch (start-up included), less the time spent evaluating
   (pipeline/tracking/loss_curve.py); a crossing is interpolated between evaluations.
6. Ratios: each other recipe's median time to H − 1.0 ÷ the budget recipe's. A run that does not
   reach a target gives a lower bound on its time: the training time of its last evaluation (at
   most the cap), so the ratio is then "≥ X×"; a budget that does not reach it gives "≤ X×".
Output: `results.json` (every curve, per-run load averages) and `table.md` in `--out`, and
benchmarks/results/budget_time_to_loss.json through result_record.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import hf_baselines  # noqa: E402
from result_record import BenchmarkRecord  # noqa: E402

DEFAULT_RECIPES = ("budget", "hf-same", "hf-run_mlm")

SHARED = ROOT.parent / "shared" / "data"
CORPUS = SHARED / "corpus" / "imdb-reviews.jsonl.zst"
BUDGET_CONFIG = "configs/budget-modernbert.json"
PIPELINE_RECIPES = {"budget": 2, "tiny": 2}
"""Ranks of each pipeline recipe: 2 ranks × 1 thread ran 4.7× the tokens/s of 1 process × 2 threads on 2 shared
cores."""
TINY_CONFIG = "configs/tiny.json"
TARGET_MARGIN = 1.0
"""The headline's target: time to this many nats below the unigram entropy."""
GOALS = {"hf-same": 2.0, "hf-run_mlm": 5.0}
"""How many times sooner than each HF recipe the budget recipe must reach H − TARGET_MARGIN."""


def prepare_data(out: Path, env: dict, documents: int = 0, vocab: int = 16000) -> tuple[Path, Path]:
    """Tokenizer and shards in `out`, made once (the shard stage skips a completed folder).

    `documents` > 0 takes the first reviews only, with 5% of them held out for validation.
    """
    corpus = CORPUS
    if documents:
        import zstandard

        corpus = out / f"imdb-first-{documents}.jsonl"
        if not corpus.exists():
            with zstandard.open(CORPUS, "rt") as f:
                corpus.write_text("".join(line for _, line in zip(range(documents), f, strict=False)))
    py, tokenizer, shards = sys.executable, out / "tokenizer", out / "shards"
    if not (tokenizer / "tokenizer.json").exists():
        subprocess.run([py, "data_prep/train_tokenizer.py", "--input", str(corpus), "--type", "bpe", "--vocab-size",
                        str(vocab), "--model-max-length", "128", "--out", str(tokenizer)], cwd=ROOT, env=env,
                       check=True)
    if not (shards / "index.json").exists():
        subprocess.run([py, "data_prep/shard.py", "--input", str(corpus), "--tokenizer", str(tokenizer), "--seq-len",
                        "128", "--val-fraction", "0.05" if documents else "0.01", "--out", str(shards), "--quiet"],
                       cwd=ROOT, env=env, check=True)
    return tokenizer, shards


def launch_environment() -> dict:
    """The environment of every timed launch: CPU DeepSpeed, this repository on the path, this venv's tools first.

    The venv's `ninja` must come first on PATH, and its own extensions folder be used: a system ninja
    and the venv's keep different build logs and take turns rebuilding DeepSpeed's comm op (1-2 min)
    inside whichever run's clock is running.
    """
    from pipeline.common.topology import use_environment_extensions_dir

    use_environment_extensions_dir()
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT), "PATH": path}


def build_comm_op() -> None:
    """Build (or load) DeepSpeed's CPU comm op once, before any run's clock starts."""
    from main_job_time import BUILD_OP

    subprocess.run([sys.executable, "-c", BUILD_OP], env=launch_environment(), cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)


def run_capped(cmd: list[str], env: dict, deadline: float, log: Path) -> None:
    """Run `cmd` until it ends or `deadline` (unix time) passes; then SIGTERM it (it stops after the step).

    The signal goes to the launched process only: the trainer (or torchrun, which passes it on to its
    ranks) shuts its DataLoader workers down itself; signalling them too would crash the rank.
    """
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return  # stopped at the cap: what it logged until then is the result
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])}… failed ({proc.returncode}); see {log}")


def recipe_config(recipe: str, a, shards: Path, tokenizer: Path, overrides: list[str]):
    """The pretraining config a recipe runs (hf-same, hf-run_mlm: the budget config, for its model and recipe)."""
    from pipeline.pretrain.preflight import load_pretrain_config

    path = TINY_CONFIG if recipe == "tiny" else a.budget_config
    return load_pretrain_config(ROOT / path, [*overrides, f"data.shards={shards}", f"data.tokenizer={tokenizer}"],
                                world_size=PIPELINE_RECIPES.get(recipe, PIPELINE_RECIPES["budget"]), check_files=False)


def model_text(model) -> str:
    """`modernbert 2 × 128` : architecture, layers × width."""
    return f"{model.architecture} {model.num_hidden_layers} × {model.hidden_size}"


def run_one(recipe: str, seed: int, a, tokenizer: Path, shards: Path, overrides: dict[str, list[str]]) -> dict:
    """One run of `recipe` under `seed`: its evaluation curve, steps, batch and the load averages around it."""
    from pipeline.tracking.loss_curve import EvalPoint, curve_from_metrics

    folder = a.out / "runs" / f"{recipe}-seed{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cache = a.out / "token_cache"
    own = overrides.get("tiny" if recipe == "tiny" else "budget", [])
    config = recipe_config(recipe, a, shards, tokenizer, own)
    load_before = os.getloadavg()
    launched = time.time()
    deadline = launched + 60 * a.max_minutes
    env = launch_environment()
    extra = {}
    if recipe in hf_baselines.RECIPES:
        spec = {"recipe": recipe, "config": str(ROOT / a.budget_config), "overrides": own,
                "ranks": PIPELINE_RECIPES["budget"], "launched_at": launched, "max_minutes": a.max_minutes,
                "seed": seed, "tokenizer": str(tokenizer), "shards": str(shards), "cache_dir": str(cache),
                "eval_sequences": a.eval_sequences, "eval_every_sequences": a.eval_every_sequences,
                "out": str(folder / "trainer"), "result": str(folder / "result.json")}
        env["OMP_NUM_THREADS"] = str(a.threads)
        # The worker stops itself at the cap (after the step); the deadline here is a backstop.
        run_capped([sys.executable, __file__, "--hf-worker", json.dumps(spec)], env, deadline + 300,
                   folder / "log.txt")
        result = json.loads((folder / "result.json").read_text())
        curve, steps, batch = [EvalPoint(**p) for p in result["curve"]], result["steps"], result["batch"]
        extra = {"model_class": result["model_class"], "parameters": result["parameters"],
                 "differences": result["differences"]}
    else:
        ranks, batch = PIPELINE_RECIPES[recipe], config.train.global_batch_size
        sets = [f"data.shards={shards}", f"data.tokenizer={tokenizer}", f"data.cache_dir={cache}",
                f"train.output_dir={folder}", f"train.seed={seed}", "train.log_every=1", "train.export=false",
                f"train.eval_every={max(1, a.eval_every_sequences // batch)}",
                f"train.eval_sequences={a.eval_sequences}", "checkpoint.every=1000000000", "checkpoint.resume=never",
                "tracking.enabled=false"]
        if recipe == "tiny":  # the budget recipe's horizon, in sequences
            budget = recipe_config("budget", a, shards, tokenizer, overrides.get("budget", [])).train
            sets.append(f"train.max_steps={budget.max_steps * budget.global_batch_size // batch}")
        sets += own
        args = [x for s in sets for x in ("--set", s)]
        env["OMP_NUM_THREADS"] = str(max(1, a.threads // ranks))
        launcher = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                         "--nproc_per_node", str(ranks)]
        path = TINY_CONFIG if recipe == "tiny" else a.budget_config
        run_capped([*launcher, "launchers/pretrain.py", "--config", path, *args], env, deadline, folder / "log.txt")
        metrics = folder / "metrics.jsonl"  # absent when the cap came before the first logged step
        records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        curve = curve_from_metrics(records, launched)
        steps = max((r["step"] for r in records if "train/loss" in r), default=0)
    return {"recipe": recipe, "seed": seed, "model": model_text(config.model), "steps": steps, "batch": batch,
            "wall_seconds": round(time.time() - launched, 1), "load_before": load_before,
            "load_after": os.getloadavg(), "overrides": own, **extra, "curve": [vars(p) for p in curve]}


def margin_label(margin: float | str) -> str:
    """`H − 1.0`: the unigram entropy less a margin, the margin as Python writes the float."""
    return f"H − {float(margin)}"


def margin_targets(entropy: float, margins: list[float]) -> dict[str, float]:
    """The losses to time: the unigram entropy less each margin, keyed by the margin as written (`"1.0"`)."""
    if any(m <= 0 for m in margins):
        raise ValueError(f"--margins must be positive nats below the entropy, got {margins}")
    return {str(m): entropy - m for m in margins}


def time_to(curve: list, target: float) -> dict:
    """When `curve` (EvalPoints) first reaches `target`; if it never does, the time it trained without (a bound).

    An unreached target would be crossed after the last evaluation, so that evaluation's step and
    training seconds are lower bounds (0 for a run that never evaluated).
    """
    from pipeline.tracking.loss_curve import first_crossing

    hit = first_crossing(curve, target)
    if hit is not None:
        return {"step": hit.step, "seconds": hit.seconds, "reached": True}
    last = curve[-1] if curve else None
    return {"step": last.step if last else 0, "seconds": last.seconds if last else 0.0, "reached": False}


def median_time(hits: list[dict]) -> dict:
    """The median over seeds of `time_to` answers: exact, or a lower bound when the median run did not reach it.

    An unreached run counts as later than every reached one (they share the cap); when that leaves
    the median unreached, the median of the runs' bounds is a lower bound on it.
    """
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
    """`recipe` ÷ `budget` median times (`median_time` answers): exact, a bound (≥ or ≤), or not measurable.

    A recipe that did not reach the target took longer than its bound, so the ratio is at least
    bound ÷ budget; a budget that did not reach it makes the ratio at most recipe ÷ bound.
    """
    if recipe["exact"] and budget["exact"]:
        kind = "exact"
    elif budget["exact"]:
        kind = "at least"
    elif recipe["exact"]:
        kind = "at most"
    else:
        return {"value": None, "kind": None, "text": "not measurable: neither reached it"}
    if budget["seconds"] <= 0:
        return {"value": None, "kind": None, "text": "not measurable: the budget recipe's time is 0"}
    value = recipe["seconds"] / budget["seconds"]
    prefix = {"exact": "", "at least": "≥ ", "at most": "≤ "}[kind]
    return {"value": value, "kind": kind, "text": f"{prefix}{value:.1f}×"}


def goal_met(ratio: dict, goal: float) -> bool | None:
    """Whether a `time_ratio` shows "≥ goal × sooner": yes, no, or None where a bound cannot tell."""
    value, kind = ratio["value"], ratio["kind"]
    if kind == "exact":
        return value >= goal
    if kind == "at least":
        return True if value >= goal else None
    if kind == "at most":
        return False if value < goal else None
    return None


def summarise(runs: list[dict], entropy: float, margins: list[float],
              max_minutes: float) -> tuple[dict, str, list[dict]]:
    """Per recipe and margin, the median time to H − margin over seeds; the ratios to the budget; the table."""
    from pipeline.pretrain.plateau import beside_plateau
    from pipeline.tracking.loss_curve import EvalPoint

    targets = margin_targets(entropy, margins)
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
    headline_margin = str(TARGET_MARGIN) if str(TARGET_MARGIN) in targets else str(margins[0])
    for row in recipes.values():
        row["median"] = {m: median_time(hits) for m, hits in row["hits"].items()}
    ratios, verdicts = {}, {}
    if "budget" in recipes:
        budget = recipes["budget"]["median"][headline_margin]
        for name, row in recipes.items():
            if name != "budget":
                ratios[name] = time_ratio(row["median"][headline_margin], budget)
                if name in GOALS and headline_margin == str(TARGET_MARGIN):
                    verdicts[name] = {"goal": GOALS[name], "met": goal_met(ratios[name], GOALS[name])}
    ratio_column = f"time to {margin_label(headline_margin)} ÷ budget"
    rows = []
    for name, row in recipes.items():
        finals = [x for x in row["final_loss"] if x is not None]
        final = beside_plateau(statistics.median(finals), entropy) if finals else "no evaluation"
        rows.append({
            "recipe": name, "model": row["model"], "batch": row["batch"], "seeds": ",".join(map(str, row["seeds"])),
            **{f"to {margin_label(m)} = {t:.3f} nats: steps, min (reached)": time_cell(row["median"][m],
                                                                                              max_minutes)
               for m, t in targets.items()},
            "final val loss (median)": final, "steps run (median)": f"{statistics.median(row['steps']):,.0f}",
            ratio_column: ratios[name]["text"] if name in ratios else "—"})
    columns = list(rows[0]) if rows else []
    lines = [f"Unigram entropy of the validation tokens (the plateau): H = {entropy:.3f} nats; targets "
             + ", ".join(f"{margin_label(m)} = {t:.3f}" for m, t in targets.items()), "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows]
    for name, verdict in verdicts.items():
        met = {True: "met", False: "not met", None: "not shown"}[verdict["met"]]
        lines.append(f"\n{name} ÷ budget, time to {margin_label(TARGET_MARGIN)}: **{ratios[name]['text']}** "
                     f"(target ≥ {verdict['goal']:g}×: {met})")
    if "budget" in recipes and headline_margin != str(TARGET_MARGIN):
        lines.append(f"\nHF ratios are timed at {margin_label(TARGET_MARGIN)}, which --margins left out: not judged")
    summary = {"unigram_entropy": entropy, "targets": targets, "ratio_margin": headline_margin,
               "recipes": {name: {k: v for k, v in row.items() if k != "hits"} | {"runs_to": row["hits"]}
                           for name, row in recipes.items()},
               "ratios": ratios, "goals": verdicts}
    return summary, "\n".join(lines), rows


def record_name(recipes: list[str], budget_config: str = BUDGET_CONFIG) -> str:
    """All three recipes on the default budget config are budget_time_to_loss; a subset of them, or another
    budget config, is its own variant, so it cannot overwrite that record."""
    name = "budget_time_to_loss"
    if sorted(recipes) != sorted(DEFAULT_RECIPES):
        name += "." + "-vs-".join(recipes)
    if (ROOT / budget_config).resolve() != (ROOT / BUDGET_CONFIG).resolve():
        name += "." + Path(budget_config).stem
    return name


def main() -> None:
    recipes_known = [*PIPELINE_RECIPES, *hf_baselines.RECIPES]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipes", default=",".join(DEFAULT_RECIPES),
                   help=f"comma list of {', '.join(recipes_known)} ('hf' is hf-run_mlm)")
    p.add_argument("--budget-config", default=BUDGET_CONFIG,
                   help="the budget recipe's config (also hf-same's recipe and both HF recipes' model)")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--baseline-seeds", default=None, help="seeds of every recipe but budget (default: --seeds)")
    p.add_argument("--max-minutes", type=float, default=7.0, help="wall-clock cap per run, from its launch")
    p.add_argument("--margins", default="1.0,1.5",
                   help="time to the unigram entropy less each margin (nats); the headline's ratios are judged at 1.0")
    p.add_argument("--documents", type=int, default=0, help="first N reviews only (0: all 75,000); a fresh --out")
    p.add_argument("--eval-every-sequences", type=int, default=320, help="evaluate every N training sequences")
    p.add_argument("--eval-sequences", type=int, default=128, help="fixed validation sequences per evaluation")
    p.add_argument("--threads", type=int, default=2, help="CPU threads per run (split between ranks)")
    p.add_argument("--set", action="append", default=[], metavar="RECIPE:KEY=VALUE",
                   help="override a key of budget's or tiny's config, e.g. budget:optimizer.lr=0.002 (budget's "
                        "apply to hf-same and hf-run_mlm too)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "budget-time-to-loss")
    p.add_argument("--hf-worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.hf_worker:
        return hf_baselines.worker(json.loads(a.hf_worker))
    if not CORPUS.exists():
        raise SystemExit(f"needs {CORPUS}")
    if not (ROOT / a.budget_config).exists():
        raise SystemExit(f"--budget-config {a.budget_config}: no such file (configs/budget-tiny.json is shipped)")
    recipes = [hf_baselines.ALIASES.get(r, r) for r in a.recipes.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    baseline_seeds = [int(s) for s in (a.baseline_seeds or a.seeds).split(",")]
    margins = [float(m) for m in a.margins.split(",")]
    unknown = [r for r in recipes if r not in recipes_known]
    bad_sets = [s for s in a.set if ":" not in s or s.split(":", 1)[0] not in PIPELINE_RECIPES]
    if unknown or bad_sets or any(m <= 0 for m in margins):
        raise SystemExit(f"unknown recipes {unknown}, --set without a pipeline recipe prefix {bad_sets}, or a "
                         f"margin ≤ 0 in {margins}")
    with BenchmarkRecord(record_name(recipes, a.budget_config), argv=sys.argv) as rec:
        measure(a, recipes, seeds, baseline_seeds, margins, rec)


def measure(a: argparse.Namespace, recipes: list[str], seeds: list[int], baseline_seeds: list[int],
            margins: list[float], rec: BenchmarkRecord) -> None:
    from pipeline.pretrain.plateau import plateau_level

    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    tokenizer, shards = prepare_data(a.out, {**os.environ, "PYTHONPATH": str(ROOT)}, a.documents)
    entropy = plateau_level(shards, tokenizer)
    print(f"unigram entropy of the validation tokens (the plateau's level): {entropy:.3f} nats", flush=True)
    build_comm_op()  # before any clock starts, so no run's time includes a compile
    overrides = {name: [s.split(":", 1)[1] for s in a.set if s.split(":", 1)[0] == name] for name in PIPELINE_RECIPES}
    runs = []
    for recipe in recipes:  # seeds inside recipes: the budget's seeds finish first if time runs short
        for seed in seeds if recipe == "budget" else baseline_seeds:
            runs.append(run_one(recipe, seed, a, tokenizer, shards, overrides))
            curve = runs[-1]["curve"]
            runs[-1]["final_loss"] = curve[-1]["loss"] if curve else None
            runs[-1]["final_margin_below_unigram"] = entropy - curve[-1]["loss"] if curve else None
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "curve"}), flush=True)
            (a.out / "results.json").write_text(json.dumps({"unigram_entropy": entropy, "runs": runs}, indent=1))
    summary, table, rows = summarise(runs, entropy, margins, a.max_minutes)
    loads = [r["load_before"][0] for r in runs] + [r["load_after"][0] for r in runs]
    conditions = (f"{len(runs)} runs, cap {a.max_minutes:g} min each, threads per run {a.threads}; budget config "
                  f"{a.budget_config}; {a.documents or 75_000} IMDB reviews; 1-min load average "
                  f"{min(loads):.2f}–{max(loads):.2f} around the runs")
    table += f"\n\n{conditions}"
    (a.out / "results.json").write_text(json.dumps({"runs": runs, "summary": summary,
                                                    "args": {k: str(v) for k, v in vars(a).items()}}, indent=1))
    (a.out / "table.md").write_text(table + "\n")
    print(table)
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
