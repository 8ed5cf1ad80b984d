"""The main job on the embedded default corpus: every stage of the pipeline, end to end.

    python launchers/run_default.py [--out runs/default] [--fresh]     (or: roberta-main-job)

Runs each stage as its own command (`python -m pipeline.commands.<stage>`, the module behind the
script named here), exactly as a user would type it:
  1. data_prep/make_default_corpus.py   Python's documentation and docstrings → corpus.jsonl
  2. data_prep/train_tokenizer.py       byte-level BPE (RoBERTa) → tokenizer/
  3. data_prep/shard.py                 packed zstd shards with a validation split → shards/
  4. data_prep/verify_shards.py         every checksum and count
  5. launchers/pretrain.py              configs/main-job.json on 2 ranks (`deepspeed --num_gpus 2`,
                                        DeepSpeed ZeRO-2 on CPU/gloo), checkpoints, MLflow, export/
  6. launchers/cloze.py                 the export fills blanks in the validation text: top-1 accuracy
                                        and three examples → cloze.json
  7. data_prep/make_embedded_task.py    a GLUE-style task from the same corpus: which standard-library
                                        package a docstring comes from (6 classes), and
     launchers/token_baseline.py        its token-count baseline (bag of words → logistic regression)
  8. launchers/finetune.py              the export and a from-scratch baseline, 3 seeds each
  9. launchers/compare.py               the table of both, joined to the pretraining run, and plots
Reruns reuse what is complete (the shard stage verifies and skips its finished shards;
pretraining resumes from its newest checkpoint); --fresh starts over.

The screen shows the stages, their results and a closing summary; each stage's full output
(framework logs, warnings, progress bars) goes to `<out>/logs/<stage>.log`, and the stage times
to `<out>/logs/timings.json`. --verbose puts all of it on screen too.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.console import run_logged
from pipeline.common.run_layout import MainJobLayout
from pipeline.common.stage_commands import stage_command, stage_env
from pipeline.common.topology import free_port, use_environment_extensions_dir
from pipeline.tracking.job_summary import render_summary

SEQ_LEN = 128
VOCAB_SIZE = 2000  # a small vocabulary leaves the unigram plateau sooner (docs/pretraining.md, the unigram plateau)


class MainJob:
    """Runs each stage as a command, its full output in `<out>/logs/<name>.log`, and keeps the stage times."""

    def __init__(self, out: Path, verbose: bool):
        self.out, self.verbose = out, verbose
        self.logs = MainJobLayout(out).logs
        self.seconds: dict[str, float] = {}
        self.started = time.monotonic()

    def run(self, step: str, name: str, stage: str, *cmd: str | Path, launcher: list[str] | None = None,
            env: dict | None = None) -> None:
        """Run one stage (`python -m pipeline.commands.<stage>`, or under `launcher`); stop the job if it fails."""
        args = [*stage_command(stage, launcher), *map(str, cmd)]
        shown = ["python", *args[1:]] if launcher is None else args
        print(f"\n== {step}\n$ {shlex.join(shown)}", flush=True)
        log = self.logs / f"{name}.log"
        # Unbuffered: the stage's prints and warnings reach the log in the order they were made.
        env = stage_env({**(env or os.environ), "PYTHONUNBUFFERED": "1"})
        started = time.monotonic()
        code = run_logged(args, log, verbose=self.verbose, env=env)
        self.seconds[name] = round(time.monotonic() - started, 1)
        self._write_timings()
        if code != 0:
            raise SystemExit(f"main job stopped: step '{step}' failed (exit {code}); full output in {log}")
        print(f"   ({self.seconds[name]:.1f} s; full output in {log.relative_to(self.out)})", flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _write_timings(self) -> None:
        write_json_atomic(self.logs / "timings.json", {"stages_s": self.seconds, "order": list(self.seconds),
                                                        "total_s": round(self.elapsed(), 1)})


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/default"),
                        help="where everything goes (default runs/default in the current folder)")
    parser.add_argument("--fresh", action="store_true", help="delete --out first and redo every stage")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--ranks", type=int, default=2, help="pretraining processes (default 2)")
    parser.add_argument("--stop-after", choices=("verify", "pretrain", "compare"), default="compare",
                        help="stop after this step (default: run all nine)")
    parser.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="fine-tune both arms through the sweep protocol (launchers/finetune.py --sweep): each "
                             "arm's setting chosen on a held-out slice of the task's training split; off by default, "
                             "as each setting adds one training run per arm")
    parser.add_argument("--verbose", action="store_true",
                        help="show every stage's full output on screen (it is always in <out>/logs/)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    out = args.out.resolve()
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    job = MainJob(out, args.verbose)
    use_environment_extensions_dir()  # inherited by every stage: DeepSpeed's comm op is built once per environment
    # The stages always log in full (--verbose): the log files keep all of it, the screen filters it.
    full = ["--verbose"]

    layout = MainJobLayout(out)
    corpus, tokenizer, shards = layout.corpus, layout.tokenizer, layout.shards
    if not corpus.exists():
        job.run("1/9 embedded corpus", "corpus", "make_default_corpus", "--out", corpus)
    if not (tokenizer / "tokenizer.json").exists():
        job.run("2/9 tokenizer", "tokenizer", "train_tokenizer", "--input", corpus, "--type", "bpe",
                "--vocab-size", VOCAB_SIZE, "--model-max-length", SEQ_LEN, "--out", tokenizer)
    job.run("3/9 shards", "shards", "shard", "--input", corpus, "--tokenizer", tokenizer,
            "--seq-len", SEQ_LEN, "--val-fraction", "0.05", "--shard-size", "1024", "--workers", args.workers,
            "--out", shards)
    job.run("4/9 verify", "verify", "verify_shards", shards)
    if args.stop_after == "verify":
        print(f"\nmain job stopped after the data stage in {job.elapsed():.0f} s; outputs in {out}")
        return
    pretrain = layout.pretrain
    deepspeed = Path(sys.executable).parent / "deepspeed"
    # One thread per rank: two ranks on two cores otherwise fight over them (measured 2× slower).
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    extensions = Path(os.environ.get("TORCH_EXTENSIONS_DIR", "~/.cache/torch_extensions")).expanduser()
    if not any(extensions.glob("**/deepspeed_shm_comm*.so")):
        print(f"\n(first pretraining in this environment: on CPU, DeepSpeed compiles its shared-memory comm op "
              f"into {extensions} once, about 70 s on 2 idle cores)", flush=True)
    job.run("5/9 pretrain (2 ranks)", "pretrain", "pretrain", "--config", "main-job",
            "--set", f"data.shards={shards}", "--set", f"data.tokenizer={tokenizer}",
            "--set", f"train.output_dir={pretrain.root}", "--set", f"tracking.uri={layout.tracking_uri}",
            *full, launcher=[str(deepspeed), "--num_gpus", str(args.ranks), "--master_port", str(free_port())],
            env=env)
    job.run("6/9 cloze check", "cloze", "cloze", "--model", pretrain.export, "--shards", shards,
            "--json", layout.cloze, env=env)
    if args.stop_after == "pretrain":
        print(f"\nmain job stopped after pretraining in {job.elapsed():.0f} s; outputs in {out}")
        return
    task = layout.task
    job.run("7/9 fine-tuning task", "task", "make_embedded_task", "--corpus", corpus, "--out", task)
    # The task's token-count baseline (seconds): beside the arms, it shows whether the task needs pretraining at all.
    job.run("7/9 token-count baseline", "token-baseline", "token_baseline",
            "--config", "embedded-docs", "--set", f"data.train_file={task / 'train.jsonl'}",
            "--set", f"data.validation_file={task / 'dev.jsonl'}", "--json", layout.token_baseline)
    tracking = ["--set", f"tracking.uri={layout.tracking_uri}"]
    sweep = [arg for spec in args.sweep for arg in ("--sweep", spec)]
    for name, extra in (("pretrained", []), ("from scratch", ["--from-scratch"])):
        folder = name.replace(" ", "-")
        job.run(f"8/9 fine-tune ({name})", f"finetune-{folder}", "finetune",
                "--config", "embedded-docs", "--model", pretrain.export,
                "--seeds", "1,2,3", *extra, *sweep, "--set", f"data.train_file={task / 'train.jsonl'}",
                "--set", f"data.validation_file={task / 'dev.jsonl'}",
                "--set", f"train.output_dir={layout.finetune(folder).root}",
                *tracking, *full, env=env)
    job.run("9/9 compare", "compare", "compare", "--uri", layout.tracking_uri,
            "--out", layout.compare, *full)
    print("\n" + render_summary(out, job.elapsed()))


if __name__ == "__main__":
    main()
