"""The run's checkpointer: where a run starts from, loading it before the loop, and saving.

A run starts from the newest intact checkpoint of its own folder (`checkpoint.resume: auto`);
without one, from `train.anneal_from` when set (anneal.py); else from step 0. `find` runs before the
engine is built, since the start decides the phase (its batch) and whether DeepSpeed must be told
of a universal checkpoint; `load` runs at the top of `Pretrainer.train`, as torchtitan's trainer
loads there. The files and their marker are checkpoints.py's.

A ZeRO checkpoint holds each rank's partition of the optimizer state, so it loads only on the world
size that wrote it. On another, rank 0 converts it once with DeepSpeed's `ds_to_universal`
(per-parameter fp32 weights and Adam moments) into `<checkpoint>/universal/`, and the engine loads
that with `checkpoint.load_universal`. The data order depends only on the step and the global batch.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from pipeline.common.atomic_files import publish_folder
from pipeline.common.errors import PipelineError
from pipeline.common.topology import Topology
from pipeline.pretrain import checkpoints
from pipeline.pretrain.anneal import Anneal
from pipeline.pretrain.engine import restore_step
from pipeline.pretrain.phases import Stretch, stretch_at

UNIVERSAL_DIR = "universal"


@dataclass(frozen=True)
class StartPoint:
    """A complete checkpoint to start from, and how."""

    checkpoint: Path
    step: int
    written_by: int | None
    """The number of ranks that wrote it (None: not recorded)."""
    universal: bool
    """Written by another number of ranks: loaded through DeepSpeed's universal checkpoint."""


class Checkpointer:
    """Finds, loads and saves this run's checkpoints on one rank."""

    def __init__(self, root: Path, topology: Topology, stretches: list[Stretch], *, resume: bool,
                 anneal: Anneal | None = None):
        self.root = root
        self.topology = topology
        self.stretches = stretches
        self.resume = resume
        self.anneal = anneal
        self.verify_seconds = self.load_seconds = 0.0

    def find(self) -> StartPoint | None:
        """Where this run starts: its own newest intact checkpoint, else the anneal's source, else None."""
        newest = self._newest_intact() if self.resume else None
        if newest is None and self.anneal is not None:
            newest = self.anneal.checkpoint
        if newest is None:
            return None
        marker = checkpoints.read_marker(newest)
        step = int(marker["step"])
        saved = marker.get("batch_plan", {})
        # The batch that trained the checkpoint's last step, in this config: the order of the data depends on it.
        last = stretch_at(self.stretches, step - 1)
        if saved.get("global_batch_size") != last.global_batch_size:
            where = f" (phase {last.phase.name})" if last.phase.name else ""
            raise PipelineError(f"checkpoint {newest} was trained with global batch {saved.get('global_batch_size')}, "
                                f"this run has {last.global_batch_size} at step {step}{where}; resuming "
                                f"would change the data order (use another train.output_dir, or the same global batch)")
        written_by = saved.get("world_size")  # per-rank optimizer partitions load only on that many ranks
        universal = written_by != self.topology.world_size and any(newest.glob("*optim_states.pt"))
        return StartPoint(newest, step, written_by, universal)

    def load(self, engine, start: StartPoint) -> int:
        """Load `start` into the engine on every rank; returns its step, which sets the LR (`engine.restore_step`)."""
        started = time.perf_counter()
        load_root = start.checkpoint.parent
        if start.universal:
            if self.topology.is_main:
                convert_to_universal(start.checkpoint)
            dist.barrier()
            load_root = start.checkpoint / UNIVERSAL_DIR
        _, client_state = engine.load_checkpoint(str(load_root), tag=start.checkpoint.name)
        if client_state is None:
            raise PipelineError(f"checkpoint {start.checkpoint}: DeepSpeed could not load it")
        state = client_state.get("train_state") or checkpoints.read_marker(start.checkpoint)["train_state"]
        step = int(state["step"])
        restore_step(engine.lr_scheduler, step)
        self.load_seconds = time.perf_counter() - started
        return step

    def save(self, engine, step: int, train_state: dict[str, Any], marker: dict[str, Any], keep_last: int) -> Path:
        return checkpoints.save_checkpoint(engine, self.root, step, train_state, marker, keep_last)

    def newest_complete(self) -> Path | None:
        return checkpoints.newest_complete(self.root)

    def resume_hint(self) -> str:
        """Where a rerun of the same command resumes (the newest complete checkpoint), in words."""
        newest = self.newest_complete()
        if newest is None and self.anneal is not None:
            return f"No checkpoint of this run is complete yet: a rerun anneals from {self.anneal.checkpoint} again."
        if newest is None:
            return "No checkpoint is complete yet: a rerun starts from step 0."
        return (f"Rerun the same command to resume from the last complete checkpoint, {newest} "
                f"(step {checkpoints.read_marker(newest)['step']}).")

    def _newest_intact(self) -> Path | None:
        """The newest complete checkpoint whose checksums hold: checked once, by rank 0, for every rank."""
        started = time.perf_counter()
        found = [None]
        if self.topology.is_main:
            newest = checkpoints.newest_intact(self.root, self._warn)
            found = [newest.name if newest else None]
        if self.topology.world_size > 1:
            dist.broadcast_object_list(found, src=0)
        self.verify_seconds = time.perf_counter() - started
        return self.root / found[0] if found[0] else None

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
