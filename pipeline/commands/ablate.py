"""RoBERTa's design studies in one command: pretrain each arm at one token budget, fine-tune, tabulate.

    roberta-ablate --study masking|input-format|batch-size|nsp|architecture|STUDY.json \\
        --corpus FILE_OR_DIR --out DIR [--budget-tokens N] [--tasks sst2,rte] [--glue-dir DIR] [--seeds 1,2,3]

For each arm: shards (made once per packing mode in `<out>/shards/`, shared by every arm and
study), pretraining of `--config` with the arm's settings for `--budget-tokens` tokens (steps =
tokens ÷ (global batch × sequence length), the budget rounded down so every arm trains on the same
tokens), its HF export, and fine-tuning on each task over the seeds through the fair protocol
(each arm's learning rate chosen on a held-out slice of the task's training split, never dev:
`--finetune-sweep`, `--no-finetune-sweep`). The study folder
`<out>/<study>/` gets `results.md`, `results.csv` (one row per arm: validation MLM loss and
perplexity, each task's median score) and `loss_curves.png`; MLflow gets one run for the study
with a child run per arm, and the arm's pretraining and fine-tuning runs beneath it.

A rerun skips finished arms and seeds. Ctrl-C stops the running stage cleanly (pretraining saves
after its step); rerun the same command to continue.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pipeline.common.errors import PipelineError, exit_on_pipeline_error

DEFAULT_FINETUNE_SWEEP = ["train.learning_rate=1e-4,3e-4,1e-3"]


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--study", required=True,
                   help="masking, input-format, batch-size, nsp, architecture, or a study file (.json)")
    p.add_argument("--corpus", required=True, help="raw text: a .txt/.jsonl(.zst) file or a folder of them")
    p.add_argument("--out", required=True, type=Path, help="work folder: tokenizer, shards, one folder per study")
    p.add_argument("--budget-tokens", type=int, default=1 << 20,
                   help="training tokens per arm, padding included (default 1,048,576: 256 steps of 32 × 128)")
    p.add_argument("--tasks", default="sst2", help="fine-tuning tasks: shipped config names or config files (sst2,rte)")
    p.add_argument("--glue-dir", help="GLUE data folder (SST-2/, RTE/, …); default: each task config's data.glue_dir")
    p.add_argument("--seeds", default="1", help="fine-tuning seeds, e.g. 1,2,3 (the table shows their median)")
    p.add_argument("--config", default="tiny",
                   help="base pretraining config of every arm: a file or a shipped config's name (default tiny: "
                        "2 layers, hidden 128)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence for the shards (default 128)")
    p.add_argument("--vocab-size", type=int, default=8000, help="BPE vocabulary trained on the corpus (default 8000)")
    p.add_argument("--tokenizer", help="use this tokenizer folder or hub name instead of training one")
    p.add_argument("--lr-scaling", choices=("paper", "sqrt"), default="paper",
                   help="batch-size study: LR × 1, 7, 10 as RoBERTa Table 3 (paper) or × √(batch factor)")
    p.add_argument("--ranks", type=int, default=1, help="pretraining processes (default 1; >1 uses torchrun)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizer processes for the shards")
    p.add_argument("--pretrain-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a pretraining config key for every arm")
    p.add_argument("--finetune-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a fine-tuning config key for every task, e.g. train.epochs=3")
    p.add_argument("--finetune-sweep", action="append", default=None, metavar="KEY=V1,V2,...",
                   help="each arm's fine-tuning setting is chosen on a held-out slice of the task's training split "
                        f"(launchers/finetune.py --sweep; default {' '.join(DEFAULT_FINETUNE_SWEEP)})")
    p.add_argument("--no-finetune-sweep", action="store_true",
                   help="fine-tune every arm with the task config's own setting instead (best epoch on dev)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else <out>/mlflow.db)")
    p.add_argument("--no-tracking", action="store_true", help="no MLflow runs (the files are written all the same)")
    p.add_argument("--verbose", action="store_true", help="show every stage's full output (always in the logs)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise PipelineError(f"--seeds {text!r}: expected comma-separated integers, e.g. 1,2,3") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise PipelineError(f"--seeds {text!r}: give at least one seed, each once")
    return seeds


def finetune_sweep(args: argparse.Namespace) -> list[str]:
    """The grid each arm's fine-tuning is swept over ([] with --no-finetune-sweep), checked before any work."""
    if args.no_finetune_sweep:
        return []
    from pipeline.finetune.protocol.sweep import parse_sweep

    grid = args.finetune_sweep or DEFAULT_FINETUNE_SWEEP
    parse_sweep(grid)
    return grid


def check_tasks(tasks: list[str], glue_dir: str | None, finetune_set: list[str]) -> None:
    """Every task's fine-tuning config and data folder, checked before any work."""
    from pipeline.ablation.runner import task_config
    from pipeline.finetune.preflight import load_finetune_config

    for task in tasks:
        try:
            path = task_config(task)
        except PipelineError as err:
            raise PipelineError(f"--tasks {task}: {err}") from None
        sets = ([f"data.glue_dir={glue_dir}"] if glue_dir else []) + finetune_set
        load_finetune_config(path, sets)


@exit_on_pipeline_error
def main(argv=None) -> None:
    args = parse_args(argv)
    from pipeline.ablation.plan import plan_study
    from pipeline.ablation.runner import StudyOptions, StudyRunner, StudyStopped
    from pipeline.ablation.studies import RUNNER_KEYS, load_study
    from pipeline.common.config.shipped_configs import find_config
    from pipeline.common.config.tree import parse_override
    from pipeline.pretrain.preflight import load_pretrain_config
    from pipeline.tracking.mlflow_run import default_tracking_uri

    corpus = Path(args.corpus).resolve()
    if not corpus.exists():
        raise PipelineError(f"--corpus {args.corpus}: no such file or folder")
    for text in args.pretrain_set:
        key = ".".join(parse_override(text)[0])
        if key in RUNNER_KEYS:
            raise PipelineError(f"--pretrain-set {text}: {key} is set by the study runner from {RUNNER_KEYS[key]}")
    if args.budget_tokens < 1:
        raise PipelineError(f"--budget-tokens {args.budget_tokens}: must be a positive number of tokens")
    config = str(find_config(args.config, "pretrain").resolve())
    base = load_pretrain_config(config, [*args.pretrain_set, "data.shards=<shards>", "data.tokenizer=<tokenizer>"],
                                world_size=args.ranks, check_files=False)
    study = load_study(args.study, base.train.global_batch_size, base.optimizer.lr, args.lr_scaling,
                       base.model.intermediate_size)
    plans = plan_study(study, config, args.pretrain_set, seq_len=args.seq_len, budget_tokens=args.budget_tokens,
                       world_size=args.ranks)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    glue_dir = str(Path(args.glue_dir).resolve()) if args.glue_dir else None
    check_tasks(tasks, glue_dir, args.finetune_set)
    tokenizer = args.tokenizer
    if tokenizer and Path(tokenizer).exists():
        tokenizer = str(Path(tokenizer).resolve())
    out = args.out.resolve()
    uri = args.tracking_uri or (default_tracking_uri() if os.environ.get("MLFLOW_TRACKING_URI") else None)
    if args.no_finetune_sweep and args.finetune_sweep:
        raise PipelineError("--no-finetune-sweep and --finetune-sweep: give one or the other")
    options = StudyOptions(str(corpus), out, args.budget_tokens, tasks, parse_seeds(args.seeds), config, glue_dir,
                           args.seq_len, args.vocab_size, tokenizer, args.ranks, args.workers, args.pretrain_set,
                           args.finetune_set, uri, not args.no_tracking, args.verbose,
                           finetune_sweep=finetune_sweep(args))
    print(f"study {study.name}: {len(plans)} arms × {plans[0].tokens:,} tokens; "
          + "; ".join(f"{p.name} {p.steps} steps × {p.global_batch}" for p in plans), flush=True)
    try:
        StudyRunner(study, plans, options).run()
    except StudyStopped as stop:
        print(f"\n{stop}")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
