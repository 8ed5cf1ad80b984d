"""A run's checkpoints as stored: DeepSpeed's engine state plus the run's record, found, verified, saved, loaded,
set aside and pruned. When to save and where a run starts are the checkpointer's (pretrain/checkpointer.py).

`<output_dir>/checkpoints/step_00001000/` holds DeepSpeed's files and, written last and atomically by
rank 0 after a barrier, the record `complete.json` (record.py). A folder without it (a run
killed, or a disk full, while saving) is never resumed from, so the previous checkpoint stays the
newest usable one. The record lists the size and sha256 of every file, so a file a failing disk
truncated or flipped a bit in is found before it is loaded: resume falls back to the previous complete
checkpoint (moving the damaged one aside), and export refuses it, both with the same message naming
the file. Checkpoints saved before checksums were recorded still load, with a warning.

A ZeRO checkpoint holds each rank's partition of the optimizer state, so it loads only on the world size that
wrote it; on another, rank 0 converts it once with DeepSpeed's `ds_to_universal` into `<checkpoint>/universal/`,
which the engine loads with `checkpoint.load_universal`. The data order does not depend on the world size.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeline.common.atomic_files import publish_folder, reporting_disk_full, sha256_file
from pipeline.common.errors import PipelineError
from pipeline.common.processes.rank_zero import decided_on_rank_zero
from pipeline.common.run_layout import PretrainLayout
from pipeline.pretrain.checkpoints.record import RECORD_FILE, CheckpointRecord, StartPoint, read_record, write_record

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
    nothing is (or if it predates checksums: `inspect` tells)."""
    return inspect(folder)[0]


def inspect(folder: Path) -> tuple[str | None, CheckpointRecord | None]:
    """(what is wrong with the checkpoint's files against its record's checksums, its record), its record read
    once; no problem and a record without checksums: a checkpoint saved before they were recorded."""
    try:
        record = read_record(folder)
    except PipelineError as err:
        return str(err), None
    files = record.files if isinstance(record.files, dict) else {}
    for name, saved in sorted(files.items()):
        path = folder / name
        where = f"checkpoint {folder}: file {name} is damaged"
        if not path.is_file():
            return f"{where} (missing)", record
        size = path.stat().st_size
        if size != saved.get("bytes"):
            return f"{where} (truncated or changed: {size} bytes, {saved.get('bytes')} when saved)", record
        if sha256_file(path) != saved.get("sha256"):
            return f"{where} (its sha256 differs from the one recorded when it was saved: a flipped bit?)", record
    return None, record


UNVERIFIABLE = "was saved without checksums and cannot be verified"


def verified_checkpoint(path: str | Path) -> tuple[Path, CheckpointRecord]:
    """A checkpoint (or a run's newest, `resolve_checkpoint`), absolute, and its record; a damaged one is refused
    with the message resume warns with, one that predates checksums warned of."""
    checkpoint = resolve_checkpoint(path).resolve()  # absolute: its name is the tag DeepSpeed loads by
    problem, record = inspect(checkpoint)
    if problem:
        raise PipelineError(problem)
    if not isinstance(record.files, dict):
        warnings.warn(f"checkpoint {checkpoint} {UNVERIFIABLE}", stacklevel=2)
    return checkpoint, record


def newest_intact(root: Path, warn: Callable[[str], None], moved: list[Path] | None = None) -> Path | None:
    """The newest complete checkpoint whose files match their checksums; each damaged one is set aside, with a
    warning (and added to `moved`)."""
    done = complete_checkpoints(root)
    for i in range(len(done) - 1, -1, -1):
        folder = done[i]
        problem, record = inspect(folder)
        if problem is None:
            if not isinstance(record.files, dict):
                warn(f"checkpoint {folder} {UNVERIFIABLE}; resuming from it")
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


def set_aside_for_start(root: Path, rolled_back: tuple[Path, ...], start: StartPoint | None,
                        warn: Callable[[str], None]) -> tuple[list[Path], Path | None]:
    """What a start sets aside, and where it then starts: the checkpoints it rolls back (`rolled_back`: they trained
    on a skipped range), the newest last; then its `start`'s checksums checked, a damaged start set aside and the
    newest intact one before it taken (an anneal's source is another run's, taken as it is). Returns (the folders
    set aside, the start's checkpoint)."""
    moved = [set_aside(folder, "rolled-back") for folder in sorted(rolled_back)]
    for aside in moved:
        warn(f"checkpoint {aside.name.removeprefix('rolled-back-')} trained on a skipped range (train.skip_steps); "
             f"set aside as {aside.name}")
    if start is None or start.anneal:
        return moved, start.checkpoint if start else None
    return moved, newest_intact(root, warn, moved)  # the plan's start is the newest left: check it


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
    # Rank 0 alone clears the way and, below, marks the checkpoint complete; the other ranks wait for it, and stop
    # with its error where it fails (a full disk), not at the collective timeout.
    decided_on_rank_zero(lambda: _clear_cut_short(folder), f"clearing {folder} before saving into it")
    # DeepSpeed writes with torch.save; a full disk surfaces as OSError or RuntimeError. The folder
    # then has no record, so it is never resumed from, and the previous checkpoint stays the newest.
    with reporting_disk_full(folder):
        engine.save_checkpoint(str(root), tag=tag, save_latest=False,
                               client_state={**extra_state(engine), **(client_state or {})})
    dist.barrier()
    decided_on_rank_zero(lambda: _mark_complete(folder, record, root, keep_last), f"marking {folder} complete")
    return folder


def _clear_cut_short(folder: Path) -> None:
    if folder.exists() and not (folder / RECORD_FILE).exists():
        shutil.rmtree(folder)  # left by a save cut short (a kill, a full disk): never mix its files with ours


def _mark_complete(folder: Path, record: CheckpointRecord, root: Path, keep_last: int) -> None:
    """Rank 0, after every rank saved: `folder`'s record, which marks it complete, then the older ones pruned.
    Checksums of every rank's files, read back once: a file damaged later (a failing disk, a cut copy) is then
    found before it is loaded."""
    write_record(folder, dataclasses.replace(record, files=file_checksums(folder)))
    prune(root, keep_last)


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
CONFIG_OWNED_GROUP_KEYS = ("lr", "initial_lr", "weight_decay", "betas", "beta1", "beta2", "eps", "max_lr",
                           "max_coeff", "min_coeff", "fused", "foreach", "capturable", "differentiable", "maximize",
                           "amsgrad", "decoupled_weight_decay", "kahan_sum", "decouple_lr")
"""An optimizer group's settings and implementation switches, which this run's config owns; everything else in a
group (torch-optimi's `step`, DeepSpeed's partitions) is state the checkpoint brings back. A checkpoint from before
fused AdamW was the default holds `fused: None`: taken from it, the run would go on unfused, or fail at its first
step where the spike guard's `skip` needs the fused kernel."""


def load_into(engine, start: StartPoint, *, is_main: bool) -> dict[str, Any]:
    """Load checkpoint `start` into `engine` on every rank: weights, moments and step come from it, the optimizer's
    settings (peak LR, weight decay, betas, the fused kernel) stay this run's, which DeepSpeed's load would
    otherwise replace with the checkpoint's (an anneal, or a resume with an edited `optimizer.lr`, would silently
    train at the old values). Returns what the run saved beside DeepSpeed's state (`save_checkpoint`)."""
    settings = [{k: group[k] for k in CONFIG_OWNED_GROUP_KEYS if k in group} for group in engine.optimizer.param_groups]
    peaks = list(engine.lr_scheduler.base_lrs)
    load_root = start.checkpoint.parent
    if start.universal:
        if is_main:
            convert_to_universal(start.checkpoint)
        dist.barrier()
        load_root = start.checkpoint / UNIVERSAL_DIR
    earlier = start.record.version < 3 and start.record.zero_stage == 0 and start.record.precision != "fp32"
    loaded, client_state = engine.load_checkpoint(str(load_root), tag=start.checkpoint.name,
                                                  load_optimizer_states=not earlier)
    if loaded is None:
        raise PipelineError(f"checkpoint {start.checkpoint}: DeepSpeed could not load it")
    if earlier:
        load_unfused_optimizer_state(engine, start.checkpoint)
    own_settings(engine.optimizer, settings)
    engine.lr_scheduler.base_lrs = peaks
    load_extra_state(engine, client_state)
    return client_state or {}


def own_settings(optimizer: torch.optim.Optimizer, settings: list[dict[str, Any]]) -> None:
    """Put this run's `settings` back into each of `optimizer`'s groups; a group that becomes fused (or capturable)
    gets its step counters on its parameters' device, as torch keeps them for that kernel."""
    state = getattr(optimizer, "state", {})
    for group, own in zip(optimizer.param_groups, settings, strict=True):
        group.update(own)
        if group.get("fused") or group.get("capturable"):
            for param in group["params"]:
                if "step" in state.get(param, {}):
                    state[param]["step"] = torch.as_tensor(state[param]["step"], dtype=torch.float32,
                                                           device=param.device)


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


def loss_scaler(engine) -> torch.amp.GradScaler | None:
    """The GradScaler of an fp16 engine at ZeRO 0; None otherwise."""
    return getattr(engine, "torch_autocast_z0_gradscaler", None)


def extra_state(engine) -> dict[str, Any]:
    """What a checkpoint holds beyond DeepSpeed's engine state (its `client_state`): ZeRO 0 fp16's loss scaler."""
    scaler = loss_scaler(engine)
    return {} if scaler is None else {"grad_scaler": scaler.state_dict()}


def load_extra_state(engine, client_state: dict[str, Any] | None) -> None:
    """Put `extra_state` back (a checkpoint without it keeps the fresh scaler)."""
    scaler = loss_scaler(engine)
    if scaler is not None and client_state and "grad_scaler" in client_state:
        scaler.load_state_dict(client_state["grad_scaler"])
