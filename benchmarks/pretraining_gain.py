"""What pretraining buys downstream: GLUE dev scores after a fixed CPU budget of pretraining, vs from scratch.

Through the user-facing commands: shards of IMDB (or every `--corpus`), pretraining for `--steps`, at most `--minutes`
(then its checkpoint is fine-tuned), each task from it and from scratch through the fair protocol; docs/finetuning.md
("What pretraining buys") has the rest. The record is pretraining_gain.VARIANT (default: the config's name).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness

DEFAULT_CONFIG = "configs/budget-modernbert-wide.json"
DEFAULT_SWEEP = ["train.learning_rate=3e-5,1e-4,3e-4"]
GAIN_TARGETS = {"sst2": 5.0, "rte": 3.0}
"""Points over from scratch that a 60-minute recipe's export should reach (medians, through the protocol)."""
MINIMAL_PAIRS_TARGET = 0.60
VAL_FRACTION = 0.01
STUDY = harness.Study(
    "pretraining_gain", question="Does an hour of CPU pretraining pay downstream?",
    metric="GLUE dev score, median over seeds, each arm's setting chosen on held-out train; minimal-pair accuracy",
    baseline="the same architecture fine-tuned from scratch (targets: SST-2 +5 points, RTE +3); a unigram model "
             "for minimal pairs", arms=("pretrained export", "from scratch"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=DEFAULT_CONFIG, help="the pretraining config")
    p.add_argument("--steps", type=int, default=None, help="pretraining optimizer steps (default: the config's)")
    p.add_argument("--minutes", type=float, default=None, help="wall-clock cap on pretraining, from its launch")
    p.add_argument("--ranks", type=int, default=2, help="pretraining processes (threads are split between them)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a pretraining key")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--train-examples", type=int, default=10_000, help="training examples of each task")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--sweep", action="append", default=None, metavar="KEY=V1,V2,...",
                   help=f"each arm's fine-tuning grid, chosen on held-out train (default {' '.join(DEFAULT_SWEEP)})")
    p.add_argument("--tasks", default="sst2", help="GLUE tasks to fine-tune, comma-separated (default sst2)")
    p.add_argument("--corpus", action="append", type=Path, default=None,
                   help="pretraining corpus, repeatable for a mix (default: ../shared/data's IMDB reviews)")
    p.add_argument("--variant", default=None, help="the record's name: pretraining_gain.VARIANT (default: the "
                   "config's name)")
    p.add_argument("--minimal-pairs", action="store_true",
                   help="also score minimal pairs from the corpus's held-out documents against a unigram model")
    p.add_argument("--out", type=Path, default=None, help="data and runs (default: a work folder, not runs/)")
    a = p.parse_args()
    a.corpus, glue = a.corpus or [harness.IMDB], harness.SHARED / "glue"
    if not all(c.exists() for c in a.corpus) or not glue.is_dir():
        p.error(f"needs {' '.join(map(str, a.corpus))} and {glue}")
    with STUDY.record(a.variant or Path(a.config).stem) as rec:
        measure(a, glue, rec)


def measure(a: argparse.Namespace, glue: Path, rec: harness.BenchmarkRecord) -> None:
    from pipeline.pretrain.report.plateau import metrics_beside_plateau  # the loss beside the plateau's level
    from pipeline.tracking.finetune_report import main_metric

    out = harness.work_dir("pretraining-gain", a.out)
    env = harness.cpu_env(max(1, (os.cpu_count() or 2) // a.ranks))
    uri, started = f"sqlite:///{out / 'mlflow.db'}", time.monotonic()
    tokenizer, shards = harness.cli_data(out, a.corpus, val_fraction=VAL_FRACTION, env=env)
    steps = a.steps or json.loads((harness.ROOT / a.config).read_text())["train"]["max_steps"]
    sets = [f"data.shards={shards}", f"data.tokenizer={tokenizer}", f"train.output_dir={out / 'pretrain'}",
            f"train.max_steps={steps}", f"train.eval_every={max(1, steps // 4)}",
            f"checkpoint.every={max(1, steps // 4)}", f"tracking.uri={uri}", "tracking.experiment=pretraining-gain",
            *a.set]
    pretrained = harness.launch(harness.pretrain_command(a.config, sets, a.ranks), env=env, cap_minutes=a.minutes)
    tasks, results = [t.strip() for t in a.tasks.split(",") if t.strip()], {}

    def finetune(task: str, scratch: bool) -> None:
        folder = out / "finetune" / f"{task}-{'scratch' if scratch else 'pretrained'}"
        harness.launch(harness.finetune_command(
            f"configs/glue/{task}.json", out / "pretrain", a.seeds, scratch=scratch, sweeps=a.sweep or DEFAULT_SWEEP,
            sets={"data.glue_dir": glue, "data.max_train_examples": a.train_examples, "train.epochs": a.epochs,
                  "train.batch_size": 32, "train.output_dir": folder, "tracking.uri": uri,
                  "tracking.experiment": "pretraining-gain"}),
            env=env, log=out / "logs" / f"finetune-{folder.name}.log")
        results[(task, scratch)] = json.loads((folder / "metrics.json").read_text())

    # The arms side by side: each fine-tuning process runs on one thread, so two use both cores.
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda job: finetune(*job), [(t, scratch) for t in tasks for scratch in (False, True)]))
    evals = harness.metrics(out / "pretrain", "eval/mlm_loss")
    done = max(r["step"] for r in harness.metrics(out / "pretrain", "train/loss"))
    batch = json.loads((out / "pretrain" / "config.json").read_text())["train"]["global_batch_size"]
    rows = []
    for task in tasks:
        pre, scr = results[(task, False)], results[(task, True)]
        chosen = " / ".join(",".join(f"{k}={v}" for k, v in r.get("chosen_setting", {}).items()) for r in (pre, scr))
        # What a recipe round is judged on: the chosen setting's score on the held-out slice of train, not dev.
        slice_ = " / ".join(f"{r['selection_score']:.4f}" if "selection_score" in r else "—" for r in (pre, scr))
        rows += [{"task": task, "metric": name, "pretrained (median)": f"{pre[name]:.4f}",
                  "from scratch (median)": f"{scr[name]:.4f}", "gain": f"{100 * (pre[name] - scr[name]):+.2f} points",
                  "pretrained mean ± sd": f"{pre[name + '_mean']:.4f} ± {pre[name + '_std']:.4f}",
                  "scratch mean ± sd": f"{scr[name + '_mean']:.4f} ± {scr[name + '_std']:.4f}",
                  "chosen (pretrained / scratch)": chosen, "held-out slice (pretrained / scratch)": slice_}
                 for name in [k for k in pre if f"{k}_mean" in pre]]
        metric = main_metric(pre)
        gain, target = 100 * (pre[metric] - scr[metric]), GAIN_TARGETS.get(task)
        rec.headline(f"{task} {metric}: pretrained − from scratch (medians)", f"{gain:+.2f} points",
                     **({"target": f"≥ +{target:g} points", "met": gain >= target} if target else {}))
        if "selection_score" in pre and "selection_score" in scr:  # a recipe round's judge
            rec.headline(f"{task} held-out slice of train: pretrained − from scratch (chosen settings)",
                         f"{100 * (pre['selection_score'] - scr['selection_score']):+.2f} points")
    if a.minimal_pairs:
        score_minimal_pairs(out, a.corpus, env, rec)
    rec.table(f"dev scores, {a.train_examples:,} training examples, {a.epochs} epochs, each arm's "
              f"{' '.join(a.sweep or DEFAULT_SWEEP)} chosen on held-out train, seeds {a.seeds}; pretrained: "
              f"{a.config}, {done} of {steps} steps × {batch} sequences on {a.ranks} CPU rank(s) in "
              f"{pretrained.seconds / 60:.1f} min", rows)
    if evals:
        rec.headline("validation MLM loss over pretraining",
                     f"{evals[0]['eval/mlm_loss']:.3f} (step {evals[0]['step']}) → {metrics_beside_plateau(evals[-1])} "
                     f"(step {evals[-1]['step']})")
    rec.headline("total time", f"{(time.monotonic() - started) / 60:.1f} min")
    print(f"python launchers/compare.py --uri {uri}")


def score_minimal_pairs(out: Path, corpus: list[Path], env: dict, rec: harness.BenchmarkRecord) -> None:
    """Pairs from the shard stage's held-out documents, the export against a unigram model of the corpus."""
    pairs, result = out / "minimal-pairs.jsonl", out / "minimal-pairs.json"
    harness.launch([sys.executable, "data_prep/make_minimal_pairs.py", "--input", *corpus, "--held-out-fraction",
                    VAL_FRACTION, "--per-phenomenon", 200, "--out", pairs])
    harness.launch([sys.executable, "launchers/minimal_pairs.py", "--model", out / "pretrain" / "export", "--pairs",
                    pairs, "--group-by", "phenomenon", "--corpus", *corpus, "--out", result], env=env)
    scores = json.loads(result.read_text())
    model, unigram = scores["model_scores"], scores["unigram_scores"]
    rec.table("minimal pairs from the corpus's held-out documents: share where the good sentence scores higher",
              [{"group": group, "pairs": m["pairs"], "export": f"{m['accuracy']:.3f}",
                "unigram model": f"{u['accuracy']:.3f}"}
               for group, m, u in [("all", model["overall"], unigram["overall"]),
                                   *[(g, r, unigram["groups"][g]) for g, r in model.get("groups", {}).items()]]])
    accuracy, frequency = model["overall"]["accuracy"], unigram["overall"]["accuracy"]
    rec.headline("minimal pairs: export accuracy", f"{accuracy:.3f} (unigram model {frequency:.3f})",
                 target=f"≥ {MINIMAL_PAIRS_TARGET} and above the unigram model",
                 met=accuracy >= MINIMAL_PAIRS_TARGET and accuracy > frequency)


if __name__ == "__main__":
    main()
