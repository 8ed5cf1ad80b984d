"""Whole fine-tuning runs, start-up included: the pipeline's `roberta-finetune` against HF `Trainer`.

    python benchmarks/finetune_speed.py [--model NAME=DIR ...] [--train 400] [--dev 200] [--epochs 2]
        [--seeds 1,2] [--max-seq-len 64] [--batch 16] [--threads 1] [--no-tracking] [--out DIR] [--smoke]

Each model (default: `2-layer`, the main job's export in runs/default/pretrain/export, made by
`bash launchers/demo.sh`: ModernBERT, 2 layers, hidden 128; and `MiniLM`, MiniLM-L6-H384 from the
`[reference]` extra) is fine-tuned on the same data with the same recipe, twice:
1. the pipeline: one launch of `python -m pipeline.commands.finetune --config custom --seeds …`, as a
   user types it (tracking as shipped: a new local MLflow store, each seed's model logged to it; each seed's
   best epoch saved as an HF folder). `--no-tracking` turns MLflow off, as HF's side has none (its own
   record, finetune_speed.no-tracking);
2. HF: one launch of this file's `hf` side, a run_glue-style script: the same jsonl files read and tokenized
   once, then for each seed `AutoModelForSequenceClassification.from_pretrained` + `Trainer` (evaluating
   every epoch, no checkpoints) and `save_model` at the end. One process for every seed is the fastest a
   run_glue user gets (run_glue itself starts once per seed), so the pipeline is compared with HF's best.

The recipe on both sides: LR, epochs, batch, max_seq_len, warmup ratio, weight decay, AdamW betas and
eps, gradient clipping, eval batch 64, seeds. Data: the first `--train` SST-2 training sentences and the
first `--dev` dev sentences (../shared/data/glue), written as the jsonl files of a custom task. Both
sides run with `--threads` threads (OMP_NUM_THREADS), one after the other, alternating per model.

Reported per model and side: the launch's wall time and its CPU time (the child's user + system
seconds: on a shared machine the CPU time moves less with the neighbours' load than the wall time),
and the dev accuracy (median over seeds; the pipeline keeps each seed's best epoch, so the HF side's
best epoch is reported too). Headlines: HF ÷ pipeline time, targets ≥ 1.5× on the 2-layer model and
≥ 1.0× (on par) on MiniLM. `--smoke` writes its record to the output folder, never benchmarks/results.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from result_record import BenchmarkRecord  # noqa: E402

SHARED = Path(os.environ.get("PIPELINE_SHARED_DATA", ROOT.parent / "shared" / "data"))
TARGETS = {"2-layer": 1.5, "MiniLM": 1.0}
"""HF time ÷ pipeline time wanted, by model name; other models are reported without a target."""
WARMUP_RATIO, WEIGHT_DECAY, BETAS, EPS, MAX_GRAD_NORM, EVAL_BATCH = 0.06, 0.1, (0.9, 0.98), 1e-6, 1.0, 64
"""The rest of the recipe: the pipeline's fine-tuning defaults (RoBERTa's GLUE recipe), given to HF too."""


def write_task(glue: Path, out: Path, train: int, dev: int) -> Path:
    """The first `train` / `dev` SST-2 sentences as a custom task's train.jsonl and dev.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    for split, cap in (("train", train), ("dev", dev)):
        lines = (glue / "SST-2" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1: 1 + cap]
        rows = [dict(zip(("text", "label"), line.rsplit("\t", 1), strict=True)) for line in lines]
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return out


def timed(cmd: list[str], threads: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one launch."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    print("$", " ".join(map(str, cmd)), flush=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run(list(map(str, cmd)), cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def pipeline_side(model: Path, task: Path, recipe: dict, seeds: str, out: Path, threads: int, tracking: bool) -> dict:
    """One `roberta-finetune` launch over every seed; each seed's best dev accuracy from its metrics.json."""
    sets = {"data.train_file": task / "train.jsonl", "data.validation_file": task / "dev.jsonl",
            "data.max_seq_len": recipe["max_seq_len"], "train.output_dir": out, "train.learning_rate": recipe["lr"],
            "train.batch_size": recipe["batch"], "train.epochs": recipe["epochs"], "train.warmup_ratio": WARMUP_RATIO,
            "train.weight_decay": WEIGHT_DECAY, "train.adam_betas": json.dumps(list(BETAS)), "train.adam_eps": EPS,
            "train.max_grad_norm": MAX_GRAD_NORM, "train.eval_batch_size": EVAL_BATCH,
            **({"tracking.uri": f"sqlite:///{out / 'mlflow.db'}", "tracking.experiment": "finetune-speed"} if tracking
               else {"tracking.enabled": "false"})}
    out.mkdir(parents=True, exist_ok=True)
    wall, cpu = timed([sys.executable, "-m", "pipeline.commands.finetune", "--config", "custom", "--model", model,
                       "--seeds", seeds, *[x for k, v in sets.items() for x in ("--set", f"{k}={v}")]], threads)
    accuracies = [json.loads((out / f"seed_{s}" / "metrics.json").read_text())["accuracy"] for s in seeds.split(",")]
    return {"wall_s": wall, "cpu_s": cpu, "accuracy": statistics.median(accuracies)}


def hf_side(model: Path, task: Path, recipe: dict, seeds: str, out: Path, threads: int) -> dict:
    """One launch of `main --hf-side`, which fine-tunes every seed with `Trainer` (see `hf_run`)."""
    out.mkdir(parents=True, exist_ok=True)
    wall, cpu = timed([sys.executable, __file__, "--hf-side", json.dumps(
        {"model": str(model), "task": str(task), "recipe": recipe, "seeds": seeds, "out": str(out)})], threads)
    accuracies = json.loads((out / "accuracy.json").read_text())
    return {"wall_s": wall, "cpu_s": cpu, "accuracy": statistics.median(accuracies)}


def hf_run(model: str, task: str, recipe: dict, seeds: str, out: str) -> None:
    """run_glue's way: jsonl read and tokenized once, then per seed a new model and `Trainer`; best dev epochs."""
    import numpy as np
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    tokenizer = AutoTokenizer.from_pretrained(model)
    splits = {name: [json.loads(line) for line in (Path(task) / f"{name}.jsonl").open(encoding="utf-8")]
              for name in ("train", "dev")}
    labels = sorted({row["label"] for row in splits["train"]})

    def encode(rows: list[dict]) -> list[dict]:
        enc = tokenizer([r["text"] for r in rows], truncation=True, max_length=recipe["max_seq_len"])
        return [{**{k: v[i] for k, v in enc.items()}, "labels": labels.index(r["label"])} for i, r in enumerate(rows)]

    train, dev = encode(splits["train"]), encode(splits["dev"])
    best = []
    for seed in map(int, seeds.split(",")):
        accuracies: list[float] = []

        def accuracy(prediction, accuracies=accuracies) -> dict:
            value = float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())
            accuracies.append(value)
            return {"accuracy": value}

        args = TrainingArguments(
            output_dir=f"{out}/seed_{seed}", learning_rate=recipe["lr"], num_train_epochs=recipe["epochs"],
            per_device_train_batch_size=recipe["batch"], per_device_eval_batch_size=EVAL_BATCH,
            warmup_steps=WARMUP_RATIO,  # transformers 5: a fraction below 1 is a ratio of the total steps
            weight_decay=WEIGHT_DECAY, adam_beta1=BETAS[0], adam_beta2=BETAS[1], adam_epsilon=EPS,
            max_grad_norm=MAX_GRAD_NORM, seed=seed, eval_strategy="epoch", save_strategy="no",
            logging_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
        hf = AutoModelForSequenceClassification.from_pretrained(model, num_labels=len(labels))
        trainer = Trainer(model=hf, args=args, train_dataset=train, eval_dataset=dev,
                          data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=accuracy)
        trainer.train()
        trainer.save_model()
        best.append(max(accuracies))
    (Path(out) / "accuracy.json").write_text(json.dumps(best))


def main() -> None:
    if sys.argv[1:2] == ["--hf-side"]:
        hf_run(**json.loads(sys.argv[2]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", default=[], metavar="NAME=DIR",
                   help="a model to compare on (repeatable); default: 2-layer (the main job's export) and MiniLM")
    p.add_argument("--glue", type=Path, default=SHARED / "glue")
    p.add_argument("--train", type=int, default=400, help="SST-2 training sentences (the first N)")
    p.add_argument("--dev", type=int, default=200, help="SST-2 dev sentences (the first N)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--max-seq-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of both sides")
    p.add_argument("--no-tracking", action="store_true", help="the pipeline without MLflow (HF's side has none)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "finetune-speed")
    p.add_argument("--smoke", action="store_true", help="a check that the script runs: its record stays in --out")
    a = p.parse_args()
    if any("=" not in m for m in a.model):
        p.error(f"--model: expected NAME=DIR, got {[m for m in a.model if '=' not in m]}")
    out = a.out.resolve()
    if a.model:
        models = {name: Path(folder).resolve() for name, folder in (m.split("=", 1) for m in a.model)}
    else:
        from pipeline.common.reference_model import reference_encoder_folder

        export = ROOT / "runs" / "default" / "pretrain" / "export"
        if not (export / "config.json").exists():
            p.error(f"--model: no 2-layer model at {export}; run `bash launchers/demo.sh` first, or name the "
                    "models with --model NAME=DIR")
        models = {"2-layer": export, "MiniLM": reference_encoder_folder()}
    recipe = {"lr": a.lr, "epochs": a.epochs, "batch": a.batch, "max_seq_len": a.max_seq_len}
    name = "finetune_speed" + (".no-tracking" if a.no_tracking else "") + (".smoke" if a.smoke else "")
    with BenchmarkRecord(name, argv=sys.argv, out_dir=out if a.smoke else None) as rec:
        task = write_task(a.glue, out / "task", a.train, a.dev)
        rows = []
        for model_name, folder in models.items():
            runs = out / "runs" / model_name
            ours = pipeline_side(folder, task, recipe, a.seeds, runs / "pipeline", a.threads, not a.no_tracking)
            hf = hf_side(folder, task, recipe, a.seeds, runs / "hf", a.threads)
            wall, cpu = hf["wall_s"] / ours["wall_s"], hf["cpu_s"] / ours["cpu_s"]
            rows.append({"model": model_name, "pipeline wall s": f"{ours['wall_s']:.1f}",
                         "HF wall s": f"{hf['wall_s']:.1f}", "HF ÷ pipeline (wall)": f"{wall:.2f}",
                         "pipeline CPU s": f"{ours['cpu_s']:.1f}", "HF CPU s": f"{hf['cpu_s']:.1f}",
                         "HF ÷ pipeline (CPU)": f"{cpu:.2f}", "pipeline dev accuracy": f"{ours['accuracy']:.4f}",
                         "HF dev accuracy (best epoch)": f"{hf['accuracy']:.4f}"})
            target = TARGETS.get(model_name)
            rec.headline(f"{model_name}: HF ÷ pipeline, whole run (CPU time)", f"{cpu:.2f}×",
                         target=None if target is None else f"≥ {target:g}×",
                         met=None if target is None else cpu >= target)
        rec.table(f"whole runs, start-up included: {len(a.seeds.split(','))} seeds, SST-2 first {a.train} train / "
                  f"{a.dev} dev sentences, {a.epochs} epochs, batch {a.batch}, LR {a.lr:g}, max_seq_len "
                  f"{a.max_seq_len}, {a.threads} thread(s) each; pipeline tracking "
                  f"{'off' if a.no_tracking else 'on (a new MLflow store)'}", rows)
        for row in rows:
            print(json.dumps(row, ensure_ascii=False))


if __name__ == "__main__":
    main()
