"""A run's checkpoints (DeepSpeed's engine state plus the run's record) and the trainer's checkpointer.

`<output_dir>/checkpoints/step_00001000/` holds DeepSpeed's files and, written last and atomically by
rank 0 after a barrier, the record `complete.json` (checkpoint_record.py). A folder without it (a run
killed, or a disk full, while saving) is never resumed from, so the previous checkpoint stays the
newest usable one. The record lists the size and sha256 of every file, so a file a failing disk
truncated or flipped a bit in is found before it is loaded: resume falls back to the previous complete
checkpoint (moving the damaged one aside), and export refuses it, both with the same message naming
the file. Checkpoints saved before checksums were recorded still load, with a warning.

The preflight plans the start (plan.py). Once the process group exists, the `Checkpointer` writes the
plan's new skipped ranges into the run's ledger (run_ledger.py), sets aside the checkpoints they roll
back and makes sure of the start's checksums, re-planning from an earlier one past a damaged one
(set-aside checkpoints beyond `checkpoint.keep_set_aside` are deleted, the first set aside first); it
loads the start at the top of `Pretrainer.train`, as torchtitan's trainer does. A ZeRO checkpoint holds
each rank's partition of the optimizer state, so it loads only on the world size that wrote it; on
another, rank 0 converts it once with DeepSpeed's `ds_to_universal` into `<checkpoint>/universal/`,
which the engine loads with `checkpoint.load_universal`. The data order does not depend on the world
size.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from pipeline.common.atomic_files import publish_folder, reporting_disk_full, sha256_file
from pipeline.common.errors import PipelineError
from pipeline.common.run_layout import PretrainLayout
from pipeline.common.topology import Topology
from pipeline.pretrain.plan.ledger import Ledger, LedgerEvent, SetAsideEvent, SkipEvent, read_ledger
from pipeline.pretrain.plan.record import RECORD_FILE, CheckpointRecord, read_record, write_record
from pipeline.pretrain.plan.run_plan import RunPlan, StartPoint
from pipeline.pretrain.step.device_step import extra_state, load_extra_state, loss_scaler

if TYPE_CHECKING:
    from pipeline.pretrain.report.run_log import RunLog

_TAG = re.compile(r"^step_(\d{8,})$")


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _TAG.match(p.name))]
    return [p for _, p in sorted(found) if (p / RECORD_FILE).exists()]


def newest_complete(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def file_checksums(folder: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {"bytes", "sha256"}} of every file under a checkpoint folder except its record."""
    return {path.relative_to(folder).as_posix(): {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name != RECORD_FILE}


def damage(folder: Path) -> str | None:
    """What is wrong with a complete checkpoint's files against the checksums in its record; None if
    nothing is (or if it predates checksums: see `unverifiable`)."""
    try:
        files = read_record(folder).files
    except PipelineError as err:
        return str(err)
    if not isinstance(files, dict):
        return None
    for name, saved in sorted(files.items()):
        path = folder / name
        where = f"checkpoint {folder}: file {name} is damaged"
        if not path.is_file():
            return f"{where} (missing)"
        size = path.stat().st_size
        if size != saved.get("bytes"):
            return f"{where} (truncated or changed: {size} bytes, {saved.get('bytes')} when saved)"
        if sha256_file(path) != saved.get("sha256"):
            return f"{where} (its sha256 differs from the one recorded when it was saved: a flipped bit?)"
    return None


def unverifiable(folder: Path) -> bool:
    """True for a checkpoint saved before checksums were recorded in its record (one `damage` found readable)."""
    return not isinstance(read_record(folder).files, dict)


def check_intact(folder: Path) -> None:
    """Raise the damage message for a damaged checkpoint; warn once for one that cannot be verified."""
    if problem := damage(folder):
        raise PipelineError(problem)
    if unverifiable(folder):
        warnings.warn(f"checkpoint {folder} was saved without checksums and cannot be verified", stacklevel=2)


def newest_intact(root: Path, warn: Callable[[str], None], moved: list[Path] | None = None) -> Path | None:
    """The newest complete checkpoint whose files match their checksums; each damaged one is set aside, with a
    warning (and added to `moved`)."""
    done = complete_checkpoints(root)
    for i in range(len(done) - 1, -1, -1):
        folder = done[i]
        problem = damage(folder)
        if problem is None:
            if unverifiable(folder):
                warn(f"checkpoint {folder} was saved without checksums and cannot be verified; resuming from it")
            return folder
        previous = f"the previous complete checkpoint {done[i - 1].name}" if i else "a fresh start (none earlier)"
        aside = set_aside(folder, "damaged")
        if moved is not None:
            moved.append(aside)
        warn(f"{problem}; falling back to {previous} (the damaged one is kept as {aside})")
    return None


_SET_ASIDE = re.compile(r"^(rolled-back|damaged)-step_(\d{8,})$")


def set_aside(folder: Path, why: str) -> Path:
    """Rename a checkpoint `<why>-step_…`: kept for inspection, never resumed from, never written into again. Its
    modification time becomes the moment it was set aside, which `prune_set_aside` orders by."""
    aside = folder.with_name(f"{why}-{folder.name}")
    shutil.rmtree(aside, ignore_errors=True)
    folder.rename(aside)
    os.utime(aside)
    return aside


def set_aside_folders(root: Path) -> list[Path]:
    """The checkpoints set aside under `root`, the first set aside first (ties: the lower step first)."""
    if not root.is_dir():
        return []
    found = [(p.stat().st_mtime_ns, int(m.group(2)), p) for p in root.iterdir() if (m := _SET_ASIDE.match(p.name))]
    return [p for *_, p in sorted(found)]


def prune_set_aside(root: Path, keep: int) -> list[Path]:
    """Delete all but the `keep` checkpoints set aside last; returns those deleted. Only set-aside folders are
    touched: never a `step_…` checkpoint, so never the one the run resumes from."""
    aside = set_aside_folders(root)
    stale = aside[: max(len(aside) - keep, 0)]
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
    return stale


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or an output folder / checkpoints folder → its newest complete checkpoint."""
    path = Path(path)
    if (path / RECORD_FILE).exists():
        return path
    for root in (path, PretrainLayout(path).checkpoints):
        newest = newest_complete(root)
        if newest:
            return newest
    if path.is_dir() and _TAG.match(path.name):
        raise PipelineError(f"checkpoint {path} is incomplete (no {RECORD_FILE}: the run stopped while saving it)")
    raise PipelineError(f"{path}: no complete checkpoint found (expected a step_NNNNNNNN folder with "
                        f"{RECORD_FILE}, or a training output folder holding checkpoints/)")


def save_checkpoint(engine, root: Path, record: CheckpointRecord, keep_last: int,
                    client_state: dict[str, Any] | None = None) -> Path:
    """Save under `root` (a run's checkpoints folder) on every rank, with `client_state` beside DeepSpeed's own;
    rank 0 writes `record` (with every file's checksum) after a barrier, which marks it complete, then prunes old
    checkpoints."""
    tag = tag_for(record.step)
    folder = root / tag
    if dist.get_rank() == 0 and folder.exists() and not (folder / RECORD_FILE).exists():
        shutil.rmtree(folder)  # left by a save cut short (a kill, a full disk): never mix its files with ours
    dist.barrier()
    # DeepSpeed writes with torch.save; a full disk surfaces as OSError or RuntimeError. The folder
    # then has no record, so it is never resumed from, and the previous checkpoint stays the newest.
    with reporting_disk_full(folder):
        engine.save_checkpoint(str(root), tag=tag, save_latest=False,
                               client_state={**extra_state(engine), **(client_state or {})})
    dist.barrier()
    if dist.get_rank() == 0:
        # Checksums of every rank's files, read back once by rank 0 after the barrier: a file damaged
        # later (a failing disk, a cut copy) is then found before it is loaded.
        write_record(folder, dataclasses.replace(record, files=file_checksums(folder)))
        prune(root, keep_last)
    dist.barrier()
    return folder


def prune(root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` complete checkpoints, and every incomplete one."""
    done = complete_checkpoints(root)
    if not done:
        return
    stale = done[:-keep_last]
    # Incomplete folders were left by a run killed while saving (prune runs right after a save has
    # been marked complete, so none is in progress): never usable, whatever their step.
    stale += [p for p in root.iterdir() if _TAG.match(p.name) and not (p / RECORD_FILE).exists()]
    for folder in stale:
        (folder / RECORD_FILE).unlink(missing_ok=True)  # unusable first, so a half-deleted folder is never resumed
        shutil.rmtree(folder, ignore_errors=True)


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
        once, for every rank). Rank 0 first adds the plan's new skipped ranges to the run's ledger, then sets
        aside the checkpoints they roll back (a kill in between still rolls them back at the next start), and
        deletes the oldest set-aside checkpoints past `checkpoint.keep_set_aside`."""
        started = time.perf_counter()
        found = [plan.start.checkpoint.name if plan.start else None]
        if self.topology.is_main:
            ledger = plan.ledger.append([SkipEvent(r.start + 1, r.stop, plan.start_step)
                                         for r in plan.unrecorded_skips])
            moved = []
            for folder in sorted(plan.rolled_back):  # the oldest first, so the newest is the last to go
                moved.append(set_aside(folder, "rolled-back"))
                self._warn(f"checkpoint {folder.name} trained on a skipped range (train.skip_steps); set aside as "
                           f"{moved[-1].name}")
            if plan.start and not plan.start.anneal:  # the plan's start is the newest left: check it, or fall back
                newest = newest_intact(self.root, self._warn, moved)
                found = [newest.name if newest else None]
            ledger.append([SetAsideEvent(p.name, "damaged" if p.name.startswith("damaged-") else "rolled-back",
                                         plan.start_step) for p in moved])
            keep = plan.config.checkpoint.keep_set_aside
            for folder in prune_set_aside(self.root, keep):
                self._warn(f"deleted {folder.name}, set aside earlier (checkpoint.keep_set_aside {keep} keeps the "
                           "last ones set aside)")
        if self.topology.world_size > 1:
            dist.broadcast_object_list(found, src=0)
        self.verify_seconds = time.perf_counter() - started
        if plan.start is not None and not plan.start.anneal and found[0] != plan.start.checkpoint.name:
            folder = self.root / found[0] if found[0] else None  # the newest intact one, or none
            plan = plan.starting_from(StartPoint.at(folder, read_record(folder), plan.world_size) if folder else None)
        self.plan = plan
        return plan

    def load(self, engine, guard=None) -> int:
        """Load the plan's start into the engine (and the spike `guard`'s window) on every rank; returns its step,
        which sets the LR (`engine.restore_step`).

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
        earlier = start.record.version < 3 and start.record.zero_stage == 0 and start.record.precision != "fp32"
        loaded, client_state = engine.load_checkpoint(str(load_root), tag=start.checkpoint.name,
                                                      load_optimizer_states=not earlier)
        if loaded is None:
            raise PipelineError(f"checkpoint {start.checkpoint}: DeepSpeed could not load it")
        load_extra_state(engine, client_state)
        if guard is not None:
            # An anneal's source trained on other data: its window says nothing of this run's level.
            held = None if start.anneal else (client_state or {}).get("spike_guard")
            guard.load_state_dict(held, start.step)
        if earlier:
            load_unfused_optimizer_state(engine, start.checkpoint)
        for group, own in zip(engine.optimizer.param_groups, settings, strict=True):
            group.update(own)
        engine.lr_scheduler.base_lrs = peaks
        from pipeline.pretrain.step.engine import restore_step  # the engine's module imports transformers

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

    def save(self, engine, step: int, guard=None) -> None:
        """A checkpoint after `step` steps, with the plan's record of them (and the spike `guard`'s window); none
        when the newest complete checkpoint is this step's already (a rerun of a finished run)."""
        if (newest := self.newest_complete()) is not None and newest.name == tag_for(step):
            return
        started = time.perf_counter()
        # The model's own shape: with model.init_from it is the folder's, not the config's.
        record = self.plan.record(step, hf_config=json.loads(engine.module.config.to_json_string()))
        guarded = {"spike_guard": guard.state_dict()} if guard is not None and guard.on else {}
        folder = save_checkpoint(engine, self.root, record, self.plan.config.checkpoint.keep_last, guarded)
        self.log.metrics.event({"checkpoint": str(folder),
                                "checkpoint_seconds": round(time.perf_counter() - started, 3)}, step)
        self.log.metrics.flush()

    def newest_complete(self) -> Path | None:
        return newest_complete(self.root)

    def note(self, ledger: Ledger, events: list[LedgerEvent]) -> Ledger:
        """`ledger` with `events` added: rank 0 appends them to the run's ledger, read afresh (this session's start
        may have added to it since the preflight read it); the other ranks hold them in memory."""
        if self.topology.is_main:
            return read_ledger(ledger.path).append(events)
        return ledger.with_events(events)

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


def load_unfused_optimizer_state(engine, checkpoint: Path) -> None:
    """An earlier release's bf16/fp16 checkpoint at ZeRO 0 (DeepSpeed's `FP16_UnfusedOptimizer`) into today's engine:
    its fp32 master weights into the module (DeepSpeed loaded their bf16/fp16 copies), its wrapped optimizer's
    state into the optimizer, and fp16's loss scale into the GradScaler, so the run goes on from the same state."""
    # DeepSpeed has just unpickled this file the same way (weights_only=False) to load the module.
    saved = torch.load(checkpoint / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["optimizer"]
    params = [p for group in engine.optimizer.param_groups for p in group["params"]]
    with torch.no_grad():
        for param, master in zip(params, [m for group in saved["fp32_groups"] for m in group], strict=True):
            param.copy_(master)
    engine.optimizer.load_state_dict(saved["optimizer_state_dict"])
    if (scaler := loss_scaler(engine)) is not None:
        scaler.load_state_dict({**scaler.state_dict(), "scale": float(saved["cur_scale"])})


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
