"""Checkpoints: DeepSpeed's engine state plus the run's record, marked complete only when every rank is done.

`<output_dir>/checkpoints/step_00001000/` holds DeepSpeed's files and, written last and atomically by
rank 0 after a barrier, the record `complete.json` (checkpoint_record.py). A folder without it (a run
killed, or a disk full, while saving) is never resumed from, so the previous checkpoint stays the
newest usable one.

The record lists the size and sha256 of every file, so a file a failing disk truncated or flipped
a bit in is found before it is loaded: resume falls back to the previous complete checkpoint (moving
the damaged one aside), and export refuses it, both with the same message naming the file.
Checkpoints saved before checksums were recorded still load, with a warning that they cannot be verified.
"""

from __future__ import annotations

import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.common.atomic_files import reporting_disk_full, sha256_file
from pipeline.common.errors import PipelineError
from pipeline.common.run_layout import PretrainLayout
from pipeline.pretrain.checkpoint_record import RECORD_FILE, CheckpointRecord, read_record, write_record

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


def newest_intact(root: Path, warn: Callable[[str], None], *, set_aside: bool = True) -> Path | None:
    """The newest complete checkpoint whose files match their checksums, warning once per damaged one.

    A damaged checkpoint is renamed `damaged-step_…` (with `set_aside`): it is kept for inspection,
    but never resumed from again, and a later save of the same step does not write into it.
    """
    done = complete_checkpoints(root)
    for i in range(len(done) - 1, -1, -1):
        folder = done[i]
        problem = damage(folder)
        if problem is None:
            if unverifiable(folder):
                warn(f"checkpoint {folder} was saved without checksums and cannot be verified; resuming from it")
            return folder
        previous = f"the previous complete checkpoint {done[i - 1].name}" if i else "a fresh start (none earlier)"
        aside = folder.with_name(f"damaged-{folder.name}")
        if set_aside:
            shutil.rmtree(aside, ignore_errors=True)
            folder.rename(aside)
        warn(f"{problem}; falling back to {previous}" + (f" (the damaged one is kept as {aside})" if set_aside else ""))
    return None


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


def save_checkpoint(engine, root: Path, record: CheckpointRecord, keep_last: int) -> Path:
    """Save under `root` (a run's checkpoints folder) on every rank; rank 0 writes `record` (with every file's
    checksum) after a barrier, which marks it complete, then prunes old checkpoints."""
    import torch.distributed as dist

    tag = tag_for(record.step)
    folder = root / tag
    if dist.get_rank() == 0 and folder.exists() and not (folder / RECORD_FILE).exists():
        shutil.rmtree(folder)  # left by a save cut short (a kill, a full disk): never mix its files with ours
    dist.barrier()
    # DeepSpeed writes with torch.save; a full disk surfaces as OSError or RuntimeError. The folder
    # then has no record, so it is never resumed from, and the previous checkpoint stays the newest.
    with reporting_disk_full(folder):
        engine.save_checkpoint(str(root), tag=tag, save_latest=False)
    dist.barrier()
    if dist.get_rank() == 0:
        # Checksums of every rank's files, read back once by rank 0 after the barrier: a file damaged
        # later (a failing disk, a cut copy) is then found before it is loaded.
        write_record(folder, record.with_files(file_checksums(folder)))
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
