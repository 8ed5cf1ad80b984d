"""The main job on the embedded default corpus: every stage of the pipeline, end to end.

    python launchers/run_default.py [--out runs/default] [--fresh]

Runs each stage as its own command, exactly as a user would type it:
  1. data_prep/make_default_corpus.py   Python's documentation and docstrings → corpus.jsonl
  2. data_prep/train_tokenizer.py       byte-level BPE (RoBERTa) → tokenizer/
  3. data_prep/shard.py                 packed zstd shards with a validation split → shards/
  4. data_prep/verify_shards.py         every checksum and count
Reruns reuse what is complete (the shard stage verifies and skips its finished shards);
--fresh starts over.
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
SEQ_LEN = 128
VOCAB_SIZE = 8000


def run(step: str, *cmd: str | Path) -> None:
    """Run one stage, streaming its output; stop the job if it fails."""
    args = [sys.executable, *map(str, cmd)]
    print(f"\n== {step}\n$ {shlex.join(['python', *args[1:]])}", flush=True)
    started = time.monotonic()
    if subprocess.run(args, cwd=ROOT).returncode != 0:
        raise SystemExit(f"main job stopped: step '{step}' failed")
    print(f"   ({time.monotonic() - started:.1f} s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "default", help="where everything goes")
    parser.add_argument("--fresh", action="store_true", help="delete --out first and redo every stage")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    out = args.out.resolve()
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    corpus, tokenizer, shards = out / "corpus.jsonl", out / "tokenizer", out / "shards"
    if not corpus.exists():
        run("1/4 embedded corpus", "data_prep/make_default_corpus.py", "--out", corpus)
    if not (tokenizer / "tokenizer.json").exists():
        run("2/4 tokenizer", "data_prep/train_tokenizer.py", "--input", corpus, "--type", "bpe",
            "--vocab-size", VOCAB_SIZE, "--model-max-length", SEQ_LEN, "--out", tokenizer)
    run("3/4 shards", "data_prep/shard.py", "--input", corpus, "--tokenizer", tokenizer, "--seq-len", SEQ_LEN,
        "--val-fraction", "0.05", "--shard-size", "1024", "--workers", args.workers, "--out", shards)
    run("4/4 verify", "data_prep/verify_shards.py", shards)
    print(f"\nmain job done in {time.monotonic() - started:.0f} s; outputs in {out}")


if __name__ == "__main__":
    main()
