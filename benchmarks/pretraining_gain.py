"""What pretraining buys downstream: SST-2 dev accuracy after a fixed CPU budget of pretraining, vs from scratch.

    python benchmarks/pretraining_gain.py [--steps 1000] [--seeds 1,2,3] [--train-examples 10000] [--out DIR]

Every stage runs through the user-facing commands, as the README shows them:
1. a 16k byte-level BPE tokenizer and 128-token shards from the IMDB corpus (../shared/data);
2. pretraining a small RoBERTa (2 layers, hidden 128) for `--steps` optimizer steps of 64
   sequences on 2 DeepSpeed CPU ranks — the fixed budget;
3. fine-tuning on SST-2 (the GLUE folder in ../shared/data) from the export and from scratch,
   the same architecture, recipe and seeds;
4. the table: median dev accuracy over the seeds, mean ± standard deviation, and the gain.
Also fine-tunes MRPC (F1/accuracy) when `--mrpc` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def run(*cmd, env=None) -> None:
    print("$", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=ROOT, env=env, check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2500, help="pretraining optimizer steps (the budget)")
    p.add_argument("--layers", type=int, default=2, help="encoder layers (hidden 128, as configs/tiny.json)")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--train-examples", type=int, default=10_000, help="SST-2 training examples used")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4, help="fine-tuning learning rate")
    p.add_argument("--mrpc", action="store_true", help="also fine-tune MRPC")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "pretraining-gain")
    a = p.parse_args()
    corpus, glue = SHARED / "corpus" / "imdb-reviews.jsonl.zst", SHARED / "glue"
    if not corpus.exists() or not glue.is_dir():
        raise SystemExit(f"needs {corpus} and {glue}")
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    uri = f"sqlite:///{out / 'mlflow.db'}"
    started = time.monotonic()
    if not (out / "tokenizer" / "tokenizer.json").exists():
        run(py, "data_prep/train_tokenizer.py", "--input", corpus, "--type", "bpe", "--vocab-size", 16000,
            "--model-max-length", 128, "--out", out / "tokenizer")
    run(py, "data_prep/shard.py", "--input", corpus, "--tokenizer", out / "tokenizer", "--seq-len", 128,
        "--val-fraction", "0.01", "--out", out / "shards", "--quiet")
    pretrain_started = time.monotonic()
    run(Path(py).parent / "deepspeed", "--num_gpus", 2, "launchers/pretrain.py", "--config", "configs/tiny.json",
        "--set", f"data.shards={out / 'shards'}", "--set", f"data.tokenizer={out / 'tokenizer'}",
        "--set", f"train.output_dir={out / 'pretrain'}", "--set", f"train.max_steps={a.steps}",
        "--set", "train.global_batch_size=64", "--set", "train.micro_batch_size=32",
        "--set", f"model.num_hidden_layers={a.layers}", "--set", "schedule.warmup_steps=100",
        "--set", f"train.eval_every={max(1, a.steps // 4)}", "--set", f"checkpoint.every={max(1, a.steps // 4)}",
        "--set", f"tracking.uri={uri}", "--set", "tracking.experiment=pretraining-gain", env=env)
    pretrain_seconds = time.monotonic() - pretrain_started
    tasks = ["sst2"] + (["mrpc"] if a.mrpc else [])
    results = {}
    for task in tasks:
        for scratch in (False, True):
            folder = out / "finetune" / f"{task}-{'scratch' if scratch else 'pretrained'}"
            run(py, "launchers/finetune.py", "--config", f"configs/glue/{task}.json", "--model", out / "pretrain",
                "--seeds", a.seeds, *(["--from-scratch"] if scratch else []),
                "--set", f"data.glue_dir={glue}", "--set", f"data.max_train_examples={a.train_examples}",
                "--set", f"train.epochs={a.epochs}", "--set", f"train.learning_rate={a.lr}",
                "--set", "train.batch_size=32", "--set", f"train.output_dir={folder}",
                "--set", f"tracking.uri={uri}", "--set", "tracking.experiment=pretraining-gain", env=env)
            results[(task, scratch)] = json.loads((folder / "metrics.json").read_text())
    losses = [json.loads(x) for x in (out / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in losses if "eval/mlm_loss" in r]
    print(f"\npretraining: {a.steps} steps × 64 sequences × 128 tokens on 2 CPU ranks in {pretrain_seconds / 60:.1f} "
          f"min; validation MLM loss {evals[0]['eval/mlm_loss']:.3f} (step {evals[0]['step']}) → "
          f"{evals[-1]['eval/mlm_loss']:.3f} (step {evals[-1]['step']})")
    print(f"fine-tuning: {a.train_examples:,} training examples, {a.epochs} epochs, LR {a.lr}, seeds {a.seeds}\n")
    print("| task | metric | pretrained (median) | from scratch (median) | gain | pretrained mean ± sd "
          "| scratch mean ± sd |")
    print("|---|---|---|---|---|---|---|")
    for task in tasks:
        pre, scr = results[(task, False)], results[(task, True)]
        for name in [k for k in pre if f"{k}_mean" in pre]:
            print(f"| {task} | {name} | {pre[name]:.4f} | {scr[name]:.4f} | **{100 * (pre[name] - scr[name]):+.1f} "
                  f"points** | {pre[name + '_mean']:.4f} ± {pre[name + '_std']:.4f} | "
                  f"{scr[name + '_mean']:.4f} ± {scr[name + '_std']:.4f} |")
    print(f"\ntotal {(time.monotonic() - started) / 60:.1f} min; python launchers/compare.py --uri {uri}")


if __name__ == "__main__":
    main()
