"""The main job on the embedded default corpus: every stage of the pipeline, end to end.

    python launchers/run_default.py [--out runs/default] [--fresh] [--seed N]     (or: roberta-main-job)

Runs each stage as its own command (`python -m pipeline.commands.<stage>`, the module behind the
script named here), exactly as a user would type it:
  1. data_prep/make_default_corpus.py   Python's documentation and docstrings → corpus.jsonl
  2. data_prep/train_tokenizer.py       byte-level BPE (RoBERTa) → tokenizer/
  3. data_prep/shard.py                 packed zstd shards, 10% of the documents held out → shards/
  4. data_prep/verify_shards.py         every checksum and count
  5. launchers/pretrain.py              configs/main-job.json on 2 ranks (`deepspeed --num_gpus 2`,
                                        DeepSpeed ZeRO-2 on CPU/gloo), checkpoints, MLflow, export/;
                                        --seed N sets its train.seed (initial weights, data order, masks)
  6. launchers/cloze.py                 the export fills blanks in the validation text → cloze.json
  7. two tasks from the same corpus, each with its token-count baseline (launchers/token_baseline.py):
     data_prep/make_embedded_task.py    keywords: which standard-library package a docstring comes
                                        from (6 classes); counting words nearly solves it
     data_prep/make_bigram_shift_task.py  word order: were two adjacent words swapped? dev from the
                                        held-out documents; counting words sits at chance
  8. launchers/finetune.py              both tasks, the export and a from-scratch baseline, through
                                        the fair protocol (--sweep: each arm's learning rate chosen on
                                        a held-out slice of train), 3 seeds, and a label-efficiency
                                        curve (--labels-per-class 8,32); and
                                        docstring search (data_prep/make_embedded_task.py --search:
                                        first sentence → the rest), both arms through a short
                                        contrastive stage on the corpus itself (no labels), then one
                                        epoch of the search pairs, fused with BM25 too; SPLADE from
                                        each arm's masked-LM head; BM25 beside
  9. launchers/minimal_pairs.py         minimal pairs made from held-out text (data_prep/
                                        make_minimal_pairs.py), the export against a unigram model
     (steps 6-9 run as processes two at a time: the short ones beside the fine-tuning runs)
 10. launchers/compare.py               the table of every run, loss curves, the label-efficiency plot
Reruns reuse what is complete (the shard stage verifies and skips its finished shards;
pretraining resumes from its newest checkpoint; finished seeds and trials are skipped); --fresh
starts over.

The screen shows the stages, their results and a closing summary; each stage's full output
(framework logs, warnings, progress bars) goes to `<out>/logs/<stage>.log`, and the stage times
to `<out>/logs/timings.json`. --verbose puts all of it on screen too.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.config.shipped_configs import find_config
from pipeline.common.console import run_logged
from pipeline.common.errors import PipelineError, exit_on_pipeline_error
from pipeline.common.processes.stage_commands import stage_command, stage_env
from pipeline.common.processes.topology import free_port, use_environment_extensions_dir
from pipeline.common.run_layout import (
    MAIN_JOB_ARMS,
    MAIN_JOB_CONFIG,
    MAIN_JOB_TASKS,
    WORD_ORDER_CONFIG,
    MainJobLayout,
)
from pipeline.finetune.outputs.card import record_baselines
from pipeline.pretrain.export.card import record_scores
from pipeline.tracking.finetune_report import read_json
from pipeline.tracking.job_summary import render_summary, started_seed
from pipeline.tracking.task_report import ARM_NAMES, task_arms, token_baseline

SEQ_LEN = 128
VOCAB_SIZE = 2000  # a small vocabulary leaves the unigram plateau sooner (docs/pretraining.md, the unigram plateau)
HELD_OUT_FRACTION = 0.1
"""Documents the shard stage holds out: the validation loss, the word-order task's dev split and the
minimal pairs all come from them, so the encoder never trained on that text."""
SEEDS = "1,2,3"
LABELS_PER_CLASS = "8,32"
FULL_OUTPUT = ["--verbose"]
"""The stages always log in full: the log files keep all of it, the screen filters it."""


@dataclass(frozen=True)
class TaskPlan:
    """How the main job fine-tunes one task: its shipped config and each arm's learning-rate grid."""

    config: str
    sweep: str


TASK_PLANS = {
    "keywords": TaskPlan("embedded-docs", "train.learning_rate=3e-4,1e-3,3e-3"),
    "word-order": TaskPlan(WORD_ORDER_CONFIG, "train.learning_rate=3e-4,1e-3"),
}
assert tuple(TASK_PLANS) == MAIN_JOB_TASKS
SEARCH_CONFIG = "docstring-search"
CORPUS_STAGE_CONFIG = "docstring-corpus"
SPARSE_CONFIG = "embed-sparse"
Run = tuple[str, str, list]
"""One stage as `MainJob.run_together` takes it: (name, stage, args)."""


class MainJob:
    """Runs each stage as a command, its full output in `<out>/logs/<name>.log`, and keeps the stage times."""

    def __init__(self, out: Path, verbose: bool):
        self.out, self.verbose = out, verbose
        self.logs = MainJobLayout(out).logs
        self.seconds: dict[str, float] = {}
        self.started = time.monotonic()
        self._timings_lock = threading.Lock()  # runs side by side record their times

    def run(self, step: str, name: str, stage: str, *cmd: str | Path, launcher: list[str] | None = None,
            env: dict | None = None) -> None:
        """Run one stage (`python -m pipeline.commands.<stage>`, or under `launcher`); stop the job if it fails."""
        args = self._args(stage, cmd, launcher)
        shown = ["python", *args[1:]] if launcher is None else args
        print(f"\n== {step}\n$ {shlex.join(shown)}", flush=True)
        code, log = self._run_logged(name, args, env, screen=None)
        if code != 0:
            raise SystemExit(f"main job stopped: step '{step}' failed (exit {code}); full output in {log}")
        print(f"   ({self.seconds[name]:.1f} s; full output in {log.relative_to(self.out)})", flush=True)

    def run_one(self, step: str, run: tuple[str, str, list], env: dict) -> None:
        """One stage given as `run_together` takes it (`(name, stage, args)`), run alone."""
        name, stage, args = run
        self.run(step, name, stage, *args, env=env)

    def run_together(self, step: str, runs: list[Run | list[Run]], env: dict, at_once: int = 2) -> None:
        """Run several stages `at_once` at a time, one line each on screen as it ends. A list of runs is a chain:
        its stages one after the other in one slot, each only once the one before it ended well.

        The main job's fine-tuning runs are single-threaded and small: two side by side use both cores.
        """
        chains = [run if isinstance(run, list) else [run] for run in runs]
        count = sum(map(len, chains))
        print(f"\n== {step} ({count} runs, {at_once} at a time; each one's output in logs/)", flush=True)
        for _, stage, cmd in (run for chain in chains for run in chain):
            print(f"$ {shlex.join(['python', *self._args(stage, cmd, None)[1:]])}", flush=True)

        def one(chain: list[Run]) -> tuple[str, int, Path]:
            for name, stage, cmd in chain:
                code, log = self._run_logged(name, self._args(stage, cmd, None), env, screen=io.StringIO())
                print(f"   {name}: {'done' if code == 0 else f'FAILED (exit {code})'} in {self.seconds[name]:.1f} s",
                      flush=True)
                if code != 0:
                    break
            return name, code, log

        with ThreadPoolExecutor(at_once) as pool:
            failed = [(name, code, log) for name, code, log in pool.map(one, chains) if code != 0]
        if failed:
            name, code, log = failed[0]
            raise SystemExit(f"main job stopped: '{name}' in step '{step}' failed (exit {code}); full output in {log}")

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @staticmethod
    def _args(stage: str, cmd, launcher: list[str] | None) -> list[str]:
        return [*stage_command(stage, launcher), *map(str, cmd)]

    def _run_logged(self, name: str, args: list[str], env: dict | None, screen) -> tuple[int, Path]:
        log = self.logs / f"{name}.log"
        # Unbuffered: the stage's prints and warnings reach the log in the order they were made.
        env = stage_env({**(env or os.environ), "PYTHONUNBUFFERED": "1"})
        started = time.monotonic()
        code = run_logged(args, log, verbose=self.verbose and screen is None, env=env, screen=screen)
        with self._timings_lock:
            self.seconds[name] = round(time.monotonic() - started, 1)
            self._write_timings()
        return code, log

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
    parser.add_argument("--seed", type=int, default=None, metavar="N",
                        help="the pretraining seed (train.seed: initial weights, data order and masks; default: "
                             f"configs/{MAIN_JOB_CONFIG}.json's)")
    parser.add_argument("--stop-after", choices=("verify", "pretrain", "compare"), default="compare",
                        help="stop after this step (default: run all ten)")
    parser.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="the grid both arms of every task are swept over (launchers/finetune.py --sweep), in "
                             "place of each task's learning-rate grid")
    parser.add_argument("--verbose", action="store_true",
                        help="show every stage's full output on screen (it is always in <out>/logs/)")
    return parser


@exit_on_pipeline_error
def main(argv: list[str] | None = None, seed_record: Path | None = None) -> None:
    """The job; `seed_record`, the seed benchmark's record in a checkout, gives the summary the recipe's spread."""
    args = build_parser().parse_args(argv)
    out = args.out.resolve()
    if args.fresh and out.exists():
        shutil.rmtree(out)
    layout = MainJobLayout(out)
    check_seed(layout, args.seed)  # before any work: a rerun resumes the pretraining already in `out`
    out.mkdir(parents=True, exist_ok=True)
    job = MainJob(out, args.verbose)
    use_environment_extensions_dir()  # inherited by every stage: an op DeepSpeed JIT-builds is built once per venv

    make_data(job, layout, args.workers)
    if args.stop_after == "verify":
        print(f"\nmain job stopped after the data stage in {job.elapsed():.0f} s; outputs in {out}")
        return
    # One thread per process: two on two cores otherwise fight over them (measured 2× slower).
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    pretrain(job, layout, env, ranks=args.ranks, seed=args.seed)
    if args.stop_after == "pretrain":
        job.run_one("6/10 cloze check", cloze_run(layout), env=env)
        record_scores(layout.pretrain.export, cloze=read_json(layout.cloze))  # into the export's card
        print(f"\nmain job stopped after pretraining in {job.elapsed():.0f} s; outputs in {out}")
        return
    make_tasks(job, layout)
    make_minimal_pairs(job, layout)
    check_and_finetune(job, layout, args.sweep, env)
    record_scores(layout.pretrain.export, cloze=read_json(layout.cloze),  # into the export's card
                  minimal_pairs=read_json(layout.minimal_pairs_result))
    record_arm_baselines(layout)
    job.run("10/10 compare", "compare", "compare", "--uri", layout.tracking_uri, "--out", layout.compare,
            *FULL_OUTPUT)
    from pipeline.tracking.label_curve_plot import plot_label_curves

    plot_label_curves(layout)
    print("\n" + render_summary(out, job.elapsed(), seed_record=seed_record))


def shipped_seed() -> int:
    """configs/main-job.json's train.seed (the trainer's default where the file leaves it out)."""
    from pipeline.pretrain.config import TrainConfig

    train = json.loads(find_config(MAIN_JOB_CONFIG, "pretrain").read_text(encoding="utf-8")).get("train", {})
    return int(train.get("seed", TrainConfig.seed))


def check_seed(layout: MainJobLayout, seed: int | None) -> None:
    """Refuse a seed other than the one the pretraining already in `layout` was started with: it would resume
    that run (or keep its finished export) under the wrong seed."""
    if (started := started_seed(layout.pretrain.config)) is None:
        return  # no pretraining there yet
    wanted = shipped_seed() if seed is None else seed
    if started != wanted:
        given = f"--seed {seed}" if seed is not None else f"no --seed (configs/{MAIN_JOB_CONFIG}.json's seed {wanted})"
        raise PipelineError(f"{given}: the pretraining in {layout.pretrain.root} was started with seed {started} "
                            f"({layout.pretrain.config}), and a rerun continues it; add --fresh to start over, or "
                            f"give another --out")


def make_data(job: MainJob, layout: MainJobLayout, workers: int) -> None:
    """Steps 1–4: the embedded corpus, the tokenizer, the shards (10% of the documents held out), verified."""
    corpus, tokenizer, shards = layout.corpus, layout.tokenizer, layout.shards
    if not corpus.exists():
        job.run("1/10 embedded corpus", "corpus", "make.default_corpus", "--out", corpus)
    if not (tokenizer / "tokenizer.json").exists():
        job.run("2/10 tokenizer", "tokenizer", "train_tokenizer", "--input", corpus, "--type", "bpe",
                "--vocab-size", VOCAB_SIZE, "--model-max-length", SEQ_LEN, "--out", tokenizer)
    job.run("3/10 shards", "shards", "shard", "--input", corpus, "--tokenizer", tokenizer,
            "--seq-len", SEQ_LEN, "--val-fraction", HELD_OUT_FRACTION, "--shard-size", "1024",
            "--workers", workers, "--out", shards)
    job.run("4/10 verify", "verify", "verify_shards", shards)


def pretrain(job: MainJob, layout: MainJobLayout, env: dict, *, ranks: int, seed: int | None = None,
             overrides: list[str] | None = None) -> None:
    """Step 5: configs/main-job.json on `ranks` DeepSpeed ranks into `pretrain/`, exported; `seed` sets
    train.seed, `overrides` are further `--set KEY=VALUE`s (a benchmark's recipe arm)."""
    deepspeed = Path(sys.executable).parent / "deepspeed"
    sets = [f"data.shards={layout.shards}", f"data.tokenizer={layout.tokenizer}",
            f"train.output_dir={layout.pretrain.root}", f"tracking.uri={layout.tracking_uri}",
            *([] if seed is None else [f"train.seed={seed}"]), *(overrides or [])]
    job.run(f"5/10 pretrain ({ranks} rank{'s' if ranks > 1 else ''})", "pretrain", "pretrain",
            "--config", MAIN_JOB_CONFIG, *(arg for s in sets for arg in ("--set", s)), *FULL_OUTPUT,
            launcher=[str(deepspeed), "--num_gpus", str(ranks), "--master_port", str(free_port())], env=env)


def make_tasks(job: MainJob, layout: MainJobLayout) -> None:
    """Both fine-tuning tasks from the corpus."""
    job.run("7/10 task: keywords", "task-keywords", "make.embedded_task", "--corpus", layout.corpus,
            "--out", layout.task("keywords"))
    # Dev from the held-out documents only; train from the documents pretraining reads (as text, never
    # with labels): the corpus holds out too few sentences for both.
    job.run("7/10 task: word order", "task-word-order", "make.bigram_shift_task", "--corpus", layout.corpus,
            "--val-fraction", HELD_OUT_FRACTION, "--train-from", "training", "--max-train", "3000",
            "--out", layout.task("word-order"))
    job.run("7/10 task: search", "task-search", "make.embedded_task", "--corpus", layout.corpus, "--search",
            "--out", layout.task("search"))
    job.run("7/10 task: the corpus's documents", "task-documents", "make.embedded_task", "--corpus", layout.corpus,
            "--documents", "--val-fraction", HELD_OUT_FRACTION, "--out", layout.task("documents"))


def token_baseline_runs(layout: MainJobLayout) -> list[tuple[str, str, list]]:
    """Each task's token-count baseline (seconds): beside the arms, it shows whether a task needs pretraining at
    all; as `MainJob.run_together` takes them."""
    return [(f"token-baseline-{task}", "token_baseline", ["--config", plan.config, *task_files(layout, task),
                                                          "--json", layout.token_baseline(task)])
            for task, plan in TASK_PLANS.items()]


def cloze_run(layout: MainJobLayout) -> tuple[str, str, list]:
    """The cloze check of the export, as `MainJob.run_together` takes it."""
    return ("cloze", "cloze", ["--model", layout.pretrain.export, "--shards", layout.shards, "--json", layout.cloze])


def check_and_finetune(job: MainJob, layout: MainJobLayout, sweep: list[str], env: dict) -> None:
    """Steps 6–9, two processes at a time: the export's cloze check and minimal pairs, the token-count baselines,
    and every task × arm through the fair protocol with a label-efficiency curve.

    The short single-process stages run beside the fine-tuning instead of before and after it, each with a core
    otherwise idle; the longest runs go first, so that the short ones fill the end.
    """
    runs = [finetune_run(layout, task, arm, layout.pretrain.export, sweep, LABELS_PER_CLASS)
            for task in TASK_PLANS for arm in MAIN_JOB_ARMS]
    runs += [search_chain(layout, arm) for arm in MAIN_JOB_ARMS]
    runs += [sparse_search_run(layout, arm) for arm in MAIN_JOB_ARMS]
    runs += [minimal_pairs_run(layout), cloze_run(layout), *token_baseline_runs(layout)]
    job.run_together("6–9/10 cloze check, minimal pairs, token-count baselines; fine-tune both tasks and search, "
                     "pretrained and from scratch", runs, env)


def task_files(layout: MainJobLayout, task: str) -> list[str]:
    folder = layout.task(task)
    return ["--set", f"data.train_file={folder / 'train.jsonl'}",
            "--set", f"data.validation_file={folder / 'dev.jsonl'}"]


def search_chain(layout: MainJobLayout, arm: str) -> list[Run]:
    """Docstring search for one arm, as a chain: a short contrastive stage on the job's own documents with no labels
    (configs/tasks/docstring-corpus.json: pairs mined from them, selected on the held-out ones), then one epoch of the
    search pairs from that folder (configs/tasks/docstring-search.json; one seed, no sweep: a glance, not the
    protocol's full comparison), which scores the model beside BM25 and fused with it."""
    corpus_stage = layout.finetune("search-corpus", arm)
    return [
        (f"corpus-stage-{arm}", "finetune", [
            "--config", CORPUS_STAGE_CONFIG, "--model", layout.pretrain.export, "--seeds", "1",
            *(["--from-scratch"] if arm == "from-scratch" else []), *task_files(layout, "documents"),
            "--set", f"train.output_dir={corpus_stage.root}", "--set", f"tracking.uri={layout.tracking_uri}",
            *FULL_OUTPUT]),
        (f"finetune-search-{arm}", "finetune", [
            "--config", SEARCH_CONFIG, "--model", corpus_stage.seed(1).model, "--seeds", "1",
            *task_files(layout, "search"), "--set", f"train.output_dir={layout.finetune('search', arm).root}",
            "--set", f"tracking.uri={layout.tracking_uri}", *FULL_OUTPUT])]


def sparse_search_run(layout: MainJobLayout, arm: str) -> Run:
    """Docstring search by SPLADE from one arm's masked-LM head (configs/tasks/embed-sparse.json on the search
    pairs, 20 steps: a glance at what the head holds, sized to the job's time; one seed, no sweep)."""
    return (f"sparse-search-{arm}", "finetune", [
        "--config", SPARSE_CONFIG, "--model", layout.pretrain.export, "--seeds", "1",
        *(["--from-scratch"] if arm == "from-scratch" else []), *task_files(layout, "search"),
        "--set", "embedding.max_steps=20",
        "--set", f"train.output_dir={layout.finetune('search-sparse', arm).root}",
        "--set", f"tracking.uri={layout.tracking_uri}", *FULL_OUTPUT])


def finetune_run(layout: MainJobLayout, task: str, arm: str, model: Path, sweep: list[str],
                 labels_per_class: str | None) -> tuple[str, str, list]:
    """One task × arm (`pretrained`, or `from-scratch`: `model`'s architecture, random weights) through the fair
    protocol into `layout`, as `MainJob.run_together` takes it; `labels_per_class` None: all labels only."""
    plan = TASK_PLANS[task]
    grid = [arg for spec in (sweep or [plan.sweep]) for arg in ("--sweep", spec)]
    curve = [] if labels_per_class is None else ["--labels-per-class", labels_per_class]
    return (f"finetune-{task}-{arm}", "finetune", [
        "--config", plan.config, "--model", model, "--seeds", SEEDS,
        *(["--from-scratch"] if arm == "from-scratch" else []), *grid, *curve, *task_files(layout, task),
        "--set", f"train.output_dir={layout.finetune(task, arm).root}", "--set", f"tracking.uri={layout.tracking_uri}",
        *FULL_OUTPUT])


def make_minimal_pairs(job: MainJob, layout: MainJobLayout) -> None:
    """Minimal pairs from the held-out documents (a fraction of a second)."""
    job.run("7/10 minimal pairs from held-out text", "minimal-pairs-make", "make.minimal_pairs",
            "--input", layout.corpus, "--held-out-fraction", HELD_OUT_FRACTION, "--per-phenomenon", "100",
            "--out", layout.minimal_pairs)


def minimal_pairs_run(layout: MainJobLayout) -> tuple[str, str, list]:
    """The minimal pairs scored by the export and by a unigram model of the corpus, as `MainJob.run_together`
    takes it."""
    return ("minimal-pairs", "minimal_pairs", ["--model", layout.pretrain.export, "--pairs", layout.minimal_pairs,
                                               "--group-by", "phenomenon", "--corpus", layout.corpus,
                                               "--out", layout.minimal_pairs_result])


def score_minimal_pairs(job: MainJob, layout: MainJobLayout, env: dict) -> None:
    """Minimal pairs made and scored, one after the other, into the export's card."""
    make_minimal_pairs(job, layout)
    job.run_one("9/10 minimal pairs: export vs unigram", minimal_pairs_run(layout), env=env)
    record_scores(layout.pretrain.export, minimal_pairs=read_json(layout.minimal_pairs_result))


def record_arm_baselines(layout: MainJobLayout) -> None:
    """Each arm's saved models' cards set its dev figures beside the other arm's and the token-count baseline's."""
    for task in MAIN_JOB_TASKS:
        arms = task_arms(layout, task)
        for arm, result in arms.items():
            if result is None:
                continue
            rows = [{"name": ARM_NAMES[other], "metric": theirs.metric, "value": theirs.median,
                     "note": f"median of {theirs.seeds} seeds, the same protocol"}
                    for other, theirs in arms.items() if other != arm and theirs is not None]
            counted = token_baseline(layout, task, result.metric)
            if counted is not None:
                rows.append({"name": "token counts", "metric": result.metric, "value": counted,
                             "note": "bag of words + logistic regression on the same split"})
            record_baselines(layout.finetune(task, arm).root, rows)


if __name__ == "__main__":
    main()
