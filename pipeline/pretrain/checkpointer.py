"""The run's checkpointer: making sure of the start the plan chose, loading it before the loop, and saving.

The preflight plans the start (plan.py): the newest checkpoint of the run's own folder whose record reads
and that trained on no skipped range, else `train.anneal_from`'s, else step 0. Here, once the process
group exists, rank 0 sets aside the checkpoints a skipped range rolls back and checks the start's
checksums; a damaged one is set aside too and the run falls back to the one before it, re-planned from
there. `load` runs at the top of `Pretrainer.train`, as torchtitan's trainer loads there. The files are
checkpoints.py's, the record checkpoint_record.py's.

A ZeRO checkpoint holds each rank's partition of the optimizer state, so it loads only on the world
size that wrote it. On another, rank 0 converts it once with DeepSpeed's `ds_to_universal`
(per-parameter fp32 weights and Adam moments) into `<checkpoint>/universal/`, and the engine loads
that with `checkpoint.load_universal`. The data order does not depend on the world size.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch.distributed as dist

from pipeline.common.atomic_files import publish_folder
from pipeline.common.errors import PipelineError
from pipeline.common.topology import Topology
from pipeline.pretrain import checkpoints
from pipeline.pretrain.checkpoint_record import read_record
from pipeline.pretrain.engine import restore_step
from pipeline.pretrain.plan import RunPlan, StartPoint
from pipeline.pretrain.pretrain_data import PretrainData
from pipeline.pretrain.run_log import RunLog

UNIVERSAL_DIR = "universal"
OPTIMIZER_SETTINGS = ("lr", "initial_lr", "weight_decay", "betas", "beta1", "beta2", "eps", "max_lr", "max_coeff",
                      "min_coeff")
"""An optimizer group's settings, which the config owns: everything else in a group (torch-optimi's `step`,
DeepSpeed's partitions) is state the checkpoint brings back."""


class Checkpointer:
    """Makes sure of, loads and saves this run's checkpoints on one rank."""

    def __init__(self, root: Path, topology: Topology, log: RunLog):
        self.root, self.topology, self.log = root, topology, log

    def confirm_start(self, plan: RunPlan) -> RunPlan:
        """The plan, or the plan from an earlier start when its own start checkpoint is damaged (rank 0 checks
        once, for every rank); the checkpoints a skipped range rolls back are set aside first."""
        started = time.perf_counter()
        found = [plan.start.checkpoint.name if plan.start else None]
        if self.topology.is_main:
            for folder in plan.rolled_back:
                aside = folder.with_name(f"rolled-back-{folder.name}")
                shutil.rmtree(aside, ignore_errors=True)
                folder.rename(aside)
                self._warn(f"checkpoint {folder.name} trained on a skipped range (train.skip_steps); set aside as "
                           f"{aside.name}")
            if plan.start and not plan.start.anneal:  # the plan's start is the newest left: check it, or fall back
                newest = checkpoints.newest_intact(self.root, self._warn)
                found = [newest.name if newest else None]
        if self.topology.world_size > 1:
            dist.broadcast_object_list(found, src=0)
        self.verify_seconds = time.perf_counter() - started
        if plan.start is not None and not plan.start.anneal and found[0] != plan.start.checkpoint.name:
            folder = self.root / found[0] if found[0] else None  # the newest intact one, or none
            plan = plan.starting_from(StartPoint.at(folder, read_record(folder), plan.world_size) if folder else None)
        self.plan = plan
        return plan

    def load(self, engine) -> int:
        """Load the plan's start into the engine on every rank; returns its step, which sets the LR
        (`engine.restore_step`).

        The weights, moments and step come from the checkpoint; the optimizer's settings (peak LR, weight decay,
        betas) stay this run's config's, which DeepSpeed's load would otherwise replace with the checkpoint's:
        an anneal, or a resume with an edited `optimizer.lr`, would silently train at the old values.
        """
        start, started = self.plan.start, time.perf_counter()
        if start.universal:
            self.log.say(f"checkpoint {start.checkpoint.name} was written by {start.record.world_size} ranks, this "
                         f"run has {self.topology.world_size}: converting it to a universal checkpoint")
        if start.record.version < 2 and not start.anneal:
            self.log.say(f"checkpoint {start.checkpoint.name} was written by an earlier release, which kept no "
                         "record of its data order: the run goes on in this release's order")
        settings = [{k: group[k] for k in OPTIMIZER_SETTINGS if k in group} for group in engine.optimizer.param_groups]
        peaks = list(engine.lr_scheduler.base_lrs)
        load_root = start.checkpoint.parent
        if start.universal:
            if self.topology.is_main:
                convert_to_universal(start.checkpoint)
            dist.barrier()
            load_root = start.checkpoint / UNIVERSAL_DIR
        loaded, _ = engine.load_checkpoint(str(load_root), tag=start.checkpoint.name)
        if loaded is None:
            raise PipelineError(f"checkpoint {start.checkpoint}: DeepSpeed could not load it")
        for group, own in zip(engine.optimizer.param_groups, settings, strict=True):
            group.update(own)
        engine.lr_scheduler.base_lrs = peaks
        restore_step(engine.lr_scheduler, start.step)
        event = {"resumed_from": str(start.checkpoint), "resume_load_seconds": round(time.perf_counter() - started, 3),
                 "checkpoint_verify_seconds": round(self.verify_seconds, 3)}
        message = f"resumed from {start.checkpoint} (step {start.step})"
        if start.anneal:
            a, peak = self.plan.anneal, self.plan.config.optimizer.lr
            event["anneal_steps"] = a.steps
            lr_from, lr_to = (self.plan.schedule.multiplier(step) * peak for step in (a.start, a.start + a.steps))
            message = (f"annealing from {start.checkpoint} (step {a.start}) for {a.steps} steps: LR {lr_from:.3g} "
                       f"to {lr_to:.3g} ({self.plan.config.schedule.decay})")
        self.log.report(start.step, event, message)
        return start.step

    def save(self, engine, step: int, data: PretrainData) -> None:
        """A checkpoint after `step` steps of `data`'s stretch, with the plan's record of them."""
        started = time.perf_counter()
        record = self.plan.record(step, phase=data.stretch.phase.name, seq_len=data.seq_len, batch=data.plan,
                                  # the model's own shape: with model.init_from it is the folder's, not the config's
                                  hf_config=json.loads(engine.module.config.to_json_string()))
        folder = checkpoints.save_checkpoint(engine, self.root, record, self.plan.config.checkpoint.keep_last)
        self.log.metrics.event({"checkpoint": str(folder),
                                "checkpoint_seconds": round(time.perf_counter() - started, 3)}, step)
        self.log.metrics.flush()

    def newest_complete(self) -> Path | None:
        return checkpoints.newest_complete(self.root)

    def resume_hint(self) -> str:
        """Where a rerun of the same command resumes (the newest complete checkpoint), in words."""
        newest = self.newest_complete()
        if newest is None and self.plan.anneal is not None:
            return (f"No checkpoint of this run is complete yet: a rerun anneals from "
                    f"{self.plan.anneal_from.checkpoint} again.")
        if newest is None:
            return "No checkpoint is complete yet: a rerun starts from step 0."
        return (f"Rerun the same command to resume from the last complete checkpoint, {newest} "
                f"(step {read_record(newest).step}).")

    def _warn(self, message: str) -> None:
        if self.topology.is_main:
            print(f"warning: {message}", file=sys.stderr, flush=True)


def convert_to_universal(checkpoint: Path) -> None:
    """Write (once) the universal copy of `checkpoint`: `<checkpoint>/universal/<tag>/`, which DeepSpeed loads."""
    done = checkpoint / UNIVERSAL_DIR / checkpoint.name / "converted"
    if done.exists():
        return
    tmp = checkpoint / (UNIVERSAL_DIR + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                           str(checkpoint), "--output_folder", str(tmp / checkpoint.name), "--inject_missing_state",
                           "--num_extract_workers", "1", "--num_merge_workers", "1"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise PipelineError(f"checkpoint {checkpoint}: conversion to a universal checkpoint (to resume on another "
                            f"number of ranks) failed:\n{proc.stderr[-2000:]}")
    (tmp / checkpoint.name / "converted").write_text("ok\n")
    publish_folder(tmp, checkpoint / UNIVERSAL_DIR)
