"""Run a study: shared tokenizer and shards, then per arm pretraining + export and fine-tuning, then the table.

Every stage is its own command, as a user would type it, started by module (`python -m
pipeline.commands.train_tokenizer`, `… shard`, `… pretrain`, `… finetune`), its full output in
`<study>/logs/`. Each is skipped when its output is complete: the tokenizer and each packing
mode's shards once for every study in `--out`; an arm's pretraining when its export exists at the
planned step; a task when every requested seed has `complete.json`. A stage that was cut short
resumes where it stopped (the shard stage from its last finished shard, pretraining from its
newest checkpoint, fine-tuning from its first unfinished seed).

Ctrl-C: the stages run in their own session, so the terminal's SIGINT reaches only this process,
which sends SIGTERM to the running stage and waits for it (a SIGTERM to this process does the
same). Pretraining then finishes its step, saves a checkpoint and exits, so a rerun loses at most
the step in progress (fine-tuning loses the seed in progress, the shard stage the shard in
progress). A second Ctrl-C stops at once.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.ablation import tracking
from pipeline.ablation.curves import plot_curves, read_curves
from pipeline.ablation.plan import ArmPlan
from pipeline.ablation.results import arm_result, results_csv, results_markdown, write_results
from pipeline.ablation.studies import Study
from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.config.shipped_configs import find_config
from pipeline.common.console import run_logged
from pipeline.common.errors import PipelineError
from pipeline.common.processes.stage_commands import stage_command, stage_env
from pipeline.common.run_layout import AblationLayout, ArmLayout, StudyLayout
from pipeline.pretrain.checkpoints import storage as checkpoints
from pipeline.pretrain.checkpoints.record import read_record


class StudyStopped(Exception):
    """Ctrl-C: the running stage was stopped cleanly; a rerun continues."""


@dataclass
class StudyOptions:
    corpus: str
    out: Path
    budget_tokens: int
    tasks: list[str]
    """Fine-tuning configs: shipped names (sst2, rte, …) or paths to fine-tuning config files."""
    seeds: list[int]
    config: str
    """The base pretraining config every arm starts from."""
    glue_dir: str | None = None
    seq_len: int = 128
    vocab_size: int = 8000
    tokenizer: str | None = None
    """A tokenizer folder or hub name; None: train a byte-level BPE on the corpus once, into `<out>/tokenizer`."""
    ranks: int = 1
    workers: int = 1
    pretrain_set: list[str] = field(default_factory=list)
    finetune_set: list[str] = field(default_factory=list)
    tracking_uri: str | None = None
    tracking: bool = True
    verbose: bool = False
    finetune_sweep: list[str] = field(default_factory=list)
    """`--sweep` grids for fine-tuning: each arm's setting chosen on a held-out slice of train ([]: the config's)."""


def task_config(task: str) -> Path:
    """`sst2` → the shipped fine-tuning config of that name; a path to a fine-tuning config is taken as is."""
    return find_config(task, "finetune")


def task_name(task: str) -> str:
    return Path(task).stem if task.endswith(".json") else task


class Stages:
    """Runs each stage as a command, its output in a log file; Ctrl-C stops the running stage cleanly."""

    def __init__(self, verbose: bool):
        self.verbose = verbose
        self.stop_requested = False
        self._running = None

    def __enter__(self) -> Stages:
        # SIGTERM too (a scheduler's or `timeout`'s stop): the stage in its own session would not get it.
        self._previous = {sig: signal.signal(sig, self._interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _interrupt(self, signum, frame) -> None:
        if self.stop_requested or self._running is None:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.stop_requested = True
        print(f"\n{signal.Signals(signum).name}: stopping the running stage cleanly (pretraining saves after "
              "its step); rerun the same command to continue. Ctrl-C again stops at once.", flush=True)
        # The launched process only: a signal to its DataLoader workers would crash the rank.
        self._running.send_signal(signal.SIGTERM)

    def run(self, title: str, log: Path, stage: str, *cmd: str | Path, launcher: list[str] | None = None) -> None:
        """Run `stage` (a module of pipeline.commands) with `cmd` as its arguments, under `launcher` if given."""
        args = [*stage_command(stage, launcher), *map(str, cmd)]
        print(f"\n== {title}\n$ {shlex.join(['python', *args[1:]] if launcher is None else args)}", flush=True)
        env = stage_env({**os.environ, "PYTHONUNBUFFERED": "1",
                         "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        started = time.monotonic()
        code = run_logged(args, log, verbose=self.verbose, env=env, start_new_session=True,
                          on_start=lambda proc: setattr(self, "_running", proc))
        self._running = None
        if self.stop_requested:
            raise StudyStopped(f"stopped during '{title}' (exit {code}); rerun the same command to continue")
        if code != 0:
            raise PipelineError(f"stage '{title}' failed (exit {code}); full output in {log}")
        print(f"   ({time.monotonic() - started:.1f} s; full output in {log})", flush=True)


class StudyRunner:
    """One study over its arms; `run()` returns the arms' results (and writes the table and curves)."""

    def __init__(self, study: Study, plans: list[ArmPlan], options: StudyOptions):
        self.study, self.plans, self.o = study, plans, options
        self.shared = AblationLayout(options.out)
        self.layout: StudyLayout = self.shared.study(study.name)
        self.uri = options.tracking_uri or self.shared.tracking_uri
        self.tokenizer = options.tokenizer or str(self.shared.tokenizer)

    def check_plan(self) -> None:
        """Refuse a rerun whose arms differ from the first run's (their folders hold the first run's models)."""
        recorded = json.loads(self.layout.plan.read_text()) if self.layout.plan.exists() else {}
        for plan in self.plans:
            before = recorded.get("arms", {}).get(plan.name)
            changed = sorted(k for k in (before or {}) if k != "description" and before[k] != plan.to_dict().get(k))
            if changed:
                raise PipelineError(f"arm {plan.name} of study {self.study.name} was run with other settings "
                                    f"({', '.join(changed)} differ) in {self.layout.arm(plan.name).root}; use another "
                                    f"--out, or delete that folder to redo the arm")
        arms = {**recorded.get("arms", {}), **{p.name: p.to_dict() for p in self.plans}}
        self.layout.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.layout.plan, {"study": self.study.name, "corpus": self.o.corpus,
                                             "config": self.o.config, "seq_len": self.o.seq_len, "arms": arms})

    def run(self) -> list:
        self.check_plan()
        with Stages(self.o.verbose) as stages:
            self.stages = stages
            self.prepare_data()
            parent = tracking.open_study_run(self.uri, self.study.name, self.layout.tracking, self.params(),
                                             self.o.tracking)
            try:
                results = [self.run_arm(plan, parent) for plan in self.plans]
            except BaseException as err:
                parent.close("KILLED" if isinstance(err, (StudyStopped, KeyboardInterrupt)) else "FAILED")
                raise
            self.write_outputs(results, parent)
            parent.close()
        return results

    def params(self) -> dict:
        return {"corpus": self.o.corpus, "budget_tokens": self.o.budget_tokens, "seq_len": self.o.seq_len,
                "config": self.o.config, "tasks": ",".join(self.o.tasks), "seeds": ",".join(map(str, self.o.seeds)),
                "arms": ",".join(p.name for p in self.plans)}

    # --- shared data ----------------------------------------------------------------------

    def prepare_data(self) -> None:
        shared, o = self.shared, self.o
        if o.tokenizer is None and not (shared.tokenizer / "tokenizer.json").exists():
            self.stages.run("tokenizer (shared by every study here)", shared.logs / "tokenizer.log",
                            "train_tokenizer", "--input", o.corpus, "--type", "bpe",
                            "--vocab-size", o.vocab_size, "--model-max-length", o.seq_len, "--out", shared.tokenizer)
        for pack in dict.fromkeys(p.pack for p in self.plans):
            folder = shared.shards(pack)
            if self._shards_done(folder, pack):
                print(f"\n== shards --pack {pack}: complete in {folder}, reused", flush=True)
                continue
            self.stages.run(f"shards --pack {pack} (shared by every arm that packs this way)",
                            shared.logs / f"shards-{pack}.log", "shard", "--input", o.corpus,
                            "--tokenizer", self.tokenizer, "--seq-len", o.seq_len, "--pack", pack,
                            "--val-fraction", "0.05", "--workers", o.workers, "--out", folder)

    def _shards_done(self, folder: Path, pack: str) -> bool:
        """Complete shards of this corpus, length and packing (anything else goes to shard.py, which says why)."""
        index = folder / "index.json"
        if not index.exists():
            return False
        info = json.loads(index.read_text())
        return (info.get("pack") == pack and info.get("seq_len") == self.o.seq_len
                and info.get("args", {}).get("inputs") == [self.o.corpus])

    # --- one arm ----------------------------------------------------------------------------

    def run_arm(self, plan: ArmPlan, parent) -> object:
        arm = self.layout.arm(plan.name)
        print(f"\n=== arm {plan.name}: {plan.description} ({plan.steps} steps × {plan.global_batch} sequences)",
              flush=True)
        arm.root.mkdir(parents=True, exist_ok=True)
        run = tracking.open_arm_run(self.uri, self.study.name, plan.name, parent, arm.tracking,
                                    {"pack": plan.pack, **plan.set, "steps": plan.steps, "tokens": plan.tokens,
                                     "global_batch": plan.global_batch, "lr": plan.lr}, self.o.tracking)
        try:
            self.pretrain(plan, arm)
            for task in self.o.tasks:
                self.finetune(plan, arm, task)
        except BaseException as err:
            run.close("KILLED" if isinstance(err, (StudyStopped, KeyboardInterrupt)) else "FAILED")
            raise
        if self.o.tracking:
            tracking.link_arm_runs(self.uri, self.study.name, plan.name, run.run_id, arm.pretrain.tracking)
        index = json.loads((self.shared.shards(plan.pack) / "index.json").read_text())
        epochs = plan.steps * plan.global_batch / max(1, index["splits"]["train"]["sequences"])
        result = arm_result(plan, arm, [task_name(t) for t in self.o.tasks], self.o.seeds, epochs)
        run.log({"val/mlm_loss": result.val_mlm_loss, "val/perplexity": result.val_perplexity,
                 **{f"{t}/{s.metric}_median": s.median for t, s in result.tasks.items()}}, plan.steps)
        run.close()
        return result

    def pretrain(self, plan: ArmPlan, arm: ArmLayout) -> None:
        layout = arm.pretrain
        newest = checkpoints.newest_complete(layout.checkpoints)
        step = read_record(newest).step if newest else 0
        if step >= plan.steps and (layout.export / "config.json").exists():
            print(f"   pretraining: finished before ({step} steps, export in {layout.export}), skipped", flush=True)
            return
        o = self.o
        sets = [*o.pretrain_set, *plan.pretrain_overrides(), f"data.shards={self.shared.shards(plan.pack)}",
                f"data.tokenizer={self.tokenizer}", f"train.output_dir={layout.root}",
                f"tracking.enabled={json.dumps(o.tracking)}", f"tracking.uri={self.uri}",
                f"tracking.experiment={tracking.experiment_name(self.study.name)}",
                f"tracking.run_name={plan.name}-pretrain"]
        launcher = None
        if o.ranks > 1:
            from pipeline.common.processes.topology import free_port

            # torchrun, not the deepspeed launcher: on SIGTERM torchrun signals its ranks and waits
            # for them (each finishes its step and checkpoints), where the deepspeed launcher
            # terminates the whole process tree, DataLoader workers included, and the ranks crash.
            launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(o.ranks),
                        "--master_port", str(free_port())]
        self.stages.run(f"{plan.name}: pretrain {plan.steps} steps + export", self.layout.logs /
                        f"{plan.name}-pretrain.log", "pretrain", "--config", o.config,
                        *(a for s in sets for a in ("--set", s)), "--verbose", launcher=launcher)

    def finetune(self, plan: ArmPlan, arm: ArmLayout, task: str) -> None:
        name = task_name(task)
        layout = arm.finetune(name)
        if all(layout.seed(s).complete.exists() for s in self.o.seeds):
            print(f"   {name}: seeds {','.join(map(str, self.o.seeds))} finished before, skipped", flush=True)
            return
        o = self.o
        sets = [*(["data.glue_dir=" + o.glue_dir] if o.glue_dir else []), *o.finetune_set,
                f"train.output_dir={layout.root}", f"tracking.enabled={json.dumps(o.tracking)}",
                f"tracking.uri={self.uri}", f"tracking.experiment={tracking.experiment_name(self.study.name)}"]
        self.stages.run(f"{plan.name}: fine-tune {name}, seeds {','.join(map(str, o.seeds))}",
                        self.layout.logs / f"{plan.name}-finetune-{name}.log", "finetune",
                        "--config", task_config(task), "--model", arm.pretrain.export,
                        "--seeds", ",".join(map(str, o.seeds)), *(a for s in sets for a in ("--set", s)),
                        *(a for grid in o.finetune_sweep for a in ("--sweep", grid)), "--verbose")

    # --- the table ----------------------------------------------------------------------------

    def write_outputs(self, results: list, parent) -> None:
        study, o, layout = self.study, self.o, self.layout
        tasks = [task_name(t) for t in o.tasks]
        curves = {p.name: read_curves(self.layout.arm(p.name).pretrain.metrics, p.global_batch * o.seq_len)
                  for p in self.plans}
        plot_curves(curves, f"{study.name}: {study.description}", layout.curves)
        setup = [f"corpus: {o.corpus}", f"base config: {o.config}, sequence length {o.seq_len}",
                 f"budget: {self.plans[0].tokens:,} training tokens per arm (--budget-tokens {o.budget_tokens:,}, "
                 "rounded down to a multiple of every arm's tokens per step)",
                 f"fine-tuning: {', '.join(tasks)}; seeds {','.join(map(str, o.seeds))}"]
        markdown = results_markdown(f"Study {study.name}: {study.description}", setup, results, tasks, study.paper,
                                    study.paper_order, layout.curves.name)
        write_results(layout.results_md, layout.results_csv, markdown, results_csv(results, tasks))
        for path in (layout.results_md, layout.results_csv, layout.curves, layout.plan):
            parent.log_artifact(path)
        print(f"\n{markdown}\nresults: {layout.results_md}, {layout.results_csv}, {layout.curves}", flush=True)
        parent.set_tags({"ablation.arms": ",".join(p.name for p in self.plans)})
