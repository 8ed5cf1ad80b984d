"""Checkpoints: DeepSpeed's engine state plus our train state, marked complete only when every rank is done.

Layout: `<output_dir>/checkpoints/step_00001000/` (under `PretrainLayout.checkpoints`) holds
DeepSpeed's files and, written last and atomically by rank 0 after a barrier, `complete.json`. A
folder without it (a run killed while saving) is never resumed from, so the previous checkpoint
stays the newest usable one. The last `checkpoint.keep_last` complete checkpoints are kept.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.run_layout import PretrainLayout

COMPLETE_MARKER = "complete.json"
_TAG = re.compile(r"^step_(\d{8,})$")


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _TAG.match(p.name))]
    return [p for _, p in sorted(found) if (p / COMPLETE_MARKER).exists()]


def newest_complete(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def read_marker(folder: Path) -> dict[str, Any]:
    return json.loads((folder / COMPLETE_MARKER).read_text())


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or an output folder / checkpoints folder → its newest complete checkpoint."""
    from pipeline.common.errors import PipelineError

    path = Path(path)
    if (path / COMPLETE_MARKER).exists():
        return path
    for root in (path, PretrainLayout(path).checkpoints):
        newest = newest_complete(root)
        if newest:
            return newest
    if path.is_dir() and _TAG.match(path.name):
        raise PipelineError(f"checkpoint {path} is incomplete (no {COMPLETE_MARKER}: the run stopped while saving it)")
    raise PipelineError(f"{path}: no complete checkpoint found (expected a step_NNNNNNNN folder with "
                        f"{COMPLETE_MARKER}, or a training output folder holding checkpoints/)")


def save_checkpoint(engine, root: Path, step: int, train_state: dict[str, Any], marker: dict[str, Any],
                    keep_last: int) -> Path:
    """Save under `root` (a run's checkpoints folder) on every rank; rank 0 marks it complete after a
    barrier, then prunes old checkpoints."""
    import torch.distributed as dist

    tag = tag_for(step)
    engine.save_checkpoint(str(root), tag=tag, client_state={"train_state": train_state}, save_latest=False)
    dist.barrier()
    folder = root / tag
    if dist.get_rank() == 0:
        write_json_atomic(folder / COMPLETE_MARKER, {"step": step, "train_state": train_state, **marker})
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
    stale += [p for p in root.iterdir() if _TAG.match(p.name) and not (p / COMPLETE_MARKER).exists()]
    for folder in stale:
        (folder / COMPLETE_MARKER).unlink(missing_ok=True)  # unusable first, so a half-deleted folder is never resumed
        shutil.rmtree(folder, ignore_errors=True)
