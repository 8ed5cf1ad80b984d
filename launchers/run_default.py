"""The main job on the embedded default corpus: every stage of the pipeline, end to end.

    python launchers/run_default.py [--out runs/default] [--fresh]

Runs each stage as its own command, exactly as a user would type it:
  1. data_prep/make_default_corpus.py   Python's documentation and docstrings → corpus.jsonl
  2. data_prep/train_tokenizer.py       byte-level BPE (RoBERTa) → tokenizer/
  3. data_prep/shard.py                 packed zstd shards with a validation split → shards/
  4. data_prep/verify_shards.py         every checksum and count
  5. launchers/pretrain.py              configs/tiny.json on 2 ranks (`deepspeed --num_gpus 2`,
                                        DeepSpeed ZeRO-2 on CPU/gloo), checkpoints, MLflow, export/
  6. data_prep/make_embedded_task.py    a GLUE-style task from the same corpus: which standard-library
                                        package a docstring comes from (6 classes)
  7. launchers/finetune.py              the export and a from-scratch baseline, 3 seeds each
  8. launchers/compare.py               the table of both, joined to the pretraining run, and plots
Reruns reuse what is complete (the shard stage verifies and skips its finished shards;
pretraining resumes from its newest checkpoint); --fresh starts over.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.common.run_layout import FinetuneLayout, PretrainLayout  # noqa: E402
from pipeline.common.topology import free_port  # noqa: E402

SEQ_LEN = 128
VOCAB_SIZE = 8000


def run(step: str, *cmd: str | Path, launcher: list[str] | None = None, env: dict | None = None) -> None:
    """Run one stage (a python script, or under `launcher`), streaming its output; stop the job if it fails."""
    args = [*(launcher or [sys.executable]), *map(str, cmd)]
    shown = ["python", *args[1:]] if launcher is None else args
    print(f"\n== {step}\n$ {shlex.join(shown)}", flush=True)
    started = time.monotonic()
    if subprocess.run(args, cwd=ROOT, env=env).returncode != 0:
        raise SystemExit(f"main job stopped: step '{step}' failed")
    print(f"   ({time.monotonic() - started:.1f} s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "default", help="where everything goes")
    parser.add_argument("--fresh", action="store_true", help="delete --out first and redo every stage")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--ranks", type=int, default=2, help="pretraining processes (default 2)")
    parser.add_argument("--stop-after", choices=("verify", "pretrain", "compare"), default="compare",
                        help="stop after this step (default: run all eight)")
    args = parser.parse_args()
    out = args.out.resolve()
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    corpus, tokenizer, shards = out / "corpus.jsonl", out / "tokenizer", out / "shards"
    if not corpus.exists():
        run("1/8 embedded corpus", "data_prep/make_default_corpus.py", "--out", corpus)
    if not (tokenizer / "tokenizer.json").exists():
        run("2/8 tokenizer", "data_prep/train_tokenizer.py", "--input", corpus, "--type", "bpe",
            "--vocab-size", VOCAB_SIZE, "--model-max-length", SEQ_LEN, "--out", tokenizer)
    run("3/8 shards", "data_prep/shard.py", "--input", corpus, "--tokenizer", tokenizer, "--seq-len", SEQ_LEN,
        "--val-fraction", "0.05", "--shard-size", "1024", "--workers", args.workers, "--out", shards)
    run("4/8 verify", "data_prep/verify_shards.py", shards)
    if args.stop_after == "verify":
        print(f"\nmain job stopped after the data stage in {time.monotonic() - started:.0f} s; outputs in {out}")
        return
    pretrain_dir = out / "pretrain"
    pretrain = PretrainLayout(pretrain_dir)
    deepspeed = Path(sys.executable).parent / "deepspeed"
    # One thread per rank: two ranks on two cores otherwise fight over them (measured 2× slower).
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    run("5/8 pretrain (2 ranks)", "launchers/pretrain.py", "--config", "configs/tiny.json",
        "--set", f"data.shards={shards}", "--set", f"data.tokenizer={tokenizer}",
        "--set", f"train.output_dir={pretrain_dir}", "--set", f"tracking.uri=sqlite:///{out / 'mlflow.db'}",
        launcher=[str(deepspeed), "--num_gpus", str(args.ranks), "--master_port", str(free_port())], env=env)
    if args.stop_after == "pretrain":
        print(f"\nmain job stopped after pretraining in {time.monotonic() - started:.0f} s; outputs in {out}")
        return
    task = out / "task"
    run("6/8 fine-tuning task", "data_prep/make_embedded_task.py", "--corpus", corpus, "--out", task)
    tracking = ["--set", f"tracking.uri=sqlite:///{out / 'mlflow.db'}"]
    for name, extra in (("pretrained", []), ("from scratch", ["--from-scratch"])):
        folder = out / "finetune" / name.replace(" ", "-")
        run(f"7/8 fine-tune ({name})", "launchers/finetune.py", "--config", "configs/glue/embedded-docs.json",
            "--model", pretrain.export, "--seeds", "1,2,3", *extra,
            "--set", f"data.train_file={task / 'train.jsonl'}", "--set", f"data.validation_file={task / 'dev.jsonl'}",
            "--set", f"train.output_dir={folder}", *tracking, env=env)
    run("8/8 compare", "launchers/compare.py", "--uri", f"sqlite:///{out / 'mlflow.db'}", "--out", out / "compare")
    print(f"\nmain job done in {time.monotonic() - started:.0f} s; outputs in {out}")
    best = FinetuneLayout(out / "finetune" / "pretrained").best_model
    print(f"model: {pretrain.export}; metrics: {pretrain.metrics}; fine-tuned: {best}; MLflow: "
          f"mlflow ui --backend-store-uri sqlite:///{out / 'mlflow.db'} --host 127.0.0.1")


if __name__ == "__main__":
    main()
