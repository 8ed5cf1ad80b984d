"""Whole fine-tuning runs, start-up included: the pipeline's `roberta-finetune` against HF `Trainer`
(docs/benchmarks.md, "Fine-tuning speed against HF `Trainer`", says what each side runs)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import harness
import hf_baselines

TARGETS = {"2-layer": 1.5, "MiniLM": 1.0}
"""HF time ÷ pipeline time wanted, by model name; other models are reported without a target."""
RECIPE = {"lr": 1e-4, "batch": 16, "warmup_ratio": 0.06, "weight_decay": 0.1, "betas": (0.9, 0.98), "eps": 1e-6,
          "max_grad_norm": 1.0, "eval_batch": 64}
"""Beside the flags, the pipeline's fine-tuning defaults (RoBERTa's GLUE recipe), given to HF too; one thread a side."""
STUDY = harness.Study(
    "finetune_speed", question="Is fine-tuning fast?", metric="wall and CPU seconds of a whole run, start-up included",
    baseline="HF Trainer, run_glue's way, every seed in one process (targets: 1.5× on the 2-layer model, on par "
    "on MiniLM)", arms=("pipeline (roberta-finetune)", "HF Trainer"))


def write_task(glue: Path, out: Path, train: int, dev: int) -> Path:
    """The first `train` / `dev` SST-2 sentences as a custom task's train.jsonl and dev.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    for split, cap in (("train", train), ("dev", dev)):
        lines = (glue / "SST-2" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1: 1 + cap]
        rows = [dict(zip(("text", "label"), line.rsplit("\t", 1), strict=True)) for line in lines]
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return out


def pipeline_side(model: Path, task: Path, recipe: dict, seeds: str, out: Path, env: dict, tracking: bool) -> dict:
    """One `roberta-finetune` launch over every seed; each seed's best dev accuracy from its metrics.json."""
    sets = {"data.train_file": task / "train.jsonl", "data.validation_file": task / "dev.jsonl",
            "train.output_dir": out, **hf_baselines.pipeline_sets(recipe),
            **({"tracking.uri": f"sqlite:///{out / 'mlflow.db'}", "tracking.experiment": "finetune-speed"} if tracking
               else {"tracking.enabled": "false"})}
    return timed([sys.executable, "-m", "pipeline.commands.finetune", "--config", "custom", "--model", model,
                  "--seeds", seeds, *harness.set_args(sets)], out, env,
                 lambda: [json.loads((out / f"seed_{s}" / "metrics.json").read_text())["accuracy"]
                          for s in seeds.split(",")])


def hf_side(model: Path, task: Path, recipe: dict, seeds: str, out: Path, env: dict) -> dict:
    """One launch of `--hf-side` (`hf_run`), which fine-tunes every seed with `Trainer`."""
    spec = {"model": str(model), "task": str(task), "recipe": recipe, "seeds": seeds, "out": str(out)}
    return timed([sys.executable, __file__, "--hf-side", json.dumps(spec)], out, env,
                 lambda: json.loads((out / "accuracy.json").read_text()))


def timed(cmd: list, out: Path, env: dict, accuracies) -> dict:
    """One side's launch into `out`: its wall and CPU seconds and the median of its seeds' dev accuracies."""
    out.mkdir(parents=True, exist_ok=True)
    run = harness.launch(cmd, env=env, quiet=True)
    return {"wall_s": run.seconds, "cpu_s": run.cpu_seconds, "accuracy": statistics.median(accuracies())}


def hf_run(model: str, task: str, recipe: dict, seeds: str, out: str) -> None:
    """run_glue's way: jsonl read and tokenized once, then per seed a new model and `Trainer`; best dev epochs."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    splits = {name: [json.loads(line) for line in (Path(task) / f"{name}.jsonl").open(encoding="utf-8")]
              for name in ("train", "dev")}
    labels = sorted({row["label"] for row in splits["train"]})
    train, dev = (hf_baselines.encode(tokenizer, [(r["text"],) for r in rows], [labels.index(r["label"]) for r in rows],
                                      recipe["max_seq_len"]) for rows in splits.values())
    best = [max(hf_baselines.finetune(model, tokenizer, train, dev, len(labels), recipe, seed, f"{out}/seed_{seed}",
                                      save=True, progress=False)[0]) for seed in map(int, seeds.split(","))]
    (Path(out) / "accuracy.json").write_text(json.dumps(best))


def main() -> None:
    if sys.argv[1:2] == ["--hf-side"]:
        hf_run(**json.loads(sys.argv[2]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", default=[], metavar="NAME=DIR",
                   help="a model to compare on (repeatable); default: MiniLM")
    p.add_argument("--glue", type=Path, default=harness.SHARED / "glue")
    p.add_argument("--train", type=int, default=400, help="SST-2 training sentences (the first N)")
    p.add_argument("--dev", type=int, default=200, help="SST-2 dev sentences (the first N)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--max-seq-len", type=int, default=64)
    p.add_argument("--no-tracking", action="store_true", help="the pipeline without MLflow (HF's side has none)")
    p.add_argument("--out", type=Path, default=None, help="the runs (default: a work folder, not runs/)")
    a = p.parse_args()
    if any("=" not in m for m in a.model):
        p.error(f"--model: expected NAME=DIR, got {[m for m in a.model if '=' not in m]}")
    if a.model:
        models = {name: Path(folder).resolve() for name, folder in (m.split("=", 1) for m in a.model)}
    else:
        from pipeline.common.reference_model import reference_encoder_folder

        models = {"MiniLM": reference_encoder_folder()}
    recipe = {**RECIPE, "epochs": a.epochs, "max_seq_len": a.max_seq_len}
    out, env = harness.work_dir("finetune-speed", a.out), harness.cpu_env(1)
    with STUDY.record("no-tracking" if a.no_tracking else None) as rec:
        task = write_task(a.glue, out / "task", a.train, a.dev)
        rows = []
        for model_name, folder in models.items():
            runs = out / "runs" / model_name
            ours = pipeline_side(folder, task, recipe, a.seeds, runs / "pipeline", env, not a.no_tracking)
            hf = hf_side(folder, task, recipe, a.seeds, runs / "hf", env)
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
                  f"{a.dev} dev sentences, {a.epochs} epochs, batch {recipe['batch']}, LR {recipe['lr']:g}, "
                  f"max_seq_len {a.max_seq_len}, 1 thread(s) each; pipeline tracking "
                  f"{'off' if a.no_tracking else 'on (a new MLflow store)'}", rows)


if __name__ == "__main__":
    main()
