"""The model a fine-tuning run starts from: an HF folder, a hub name, or a pretraining checkpoint.

A checkpoint (or a pretraining output folder) is exported to an HF folder first, once: by the
main process, while the others wait at a barrier and then read the finished folder. Several
processes exporting into one folder would race on its temporary and final names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.errors import PipelineError
from pipeline.common.fingerprints import checkpoint_fingerprint
from pipeline.common.hub_names import local_or_hub
from pipeline.common.run_layout import PretrainLayout
from pipeline.pretrain.checkpoints import COMPLETE_MARKER, read_marker, resolve_checkpoint
from pipeline.pretrain.export import PROVENANCE_FILE


@dataclass(frozen=True)
class ModelSource:
    """The HF folder (or hub name) to fine-tune, and where it came from (for the MLflow link)."""

    path: str
    pretrain_run_id: str | None = None
    pretrain_checkpoint: str | None = None


def is_pretraining_output(path: Path) -> bool:
    """A checkpoint folder, or a pretraining output folder holding checkpoints."""
    return path.is_dir() and ((path / COMPLETE_MARKER).exists() or PretrainLayout(path).checkpoints.is_dir())


def resolve_model(model: str, export_to: Path, *, is_main: bool, barrier: Callable[[], None],
                  keep_export: bool = False) -> ModelSource:
    """`model` as an HF folder or hub name; a checkpoint is exported to `export_to` by the main process.

    Every process must call this (it holds a barrier). A folder already exported from the same
    checkpoint (same path and same files: a run retrained into the same folder is another one) is reused.
    With `keep_export` (finished seeds were fine-tuned from its weights) an export of another
    checkpoint is refused, on every process, rather than replaced.
    """
    path = Path(local_or_hub(model, "--model"))
    if is_pretraining_output(path):
        checkpoint = resolve_checkpoint(path).resolve()
        made_from, identity = exported_from(export_to), exported_identity(checkpoint)
        if keep_export and made_from is not None and made_from != identity:
            raise PipelineError(f"{export_to} is the export of {made_from[0]} (fingerprint {made_from[1]}) that "
                                f"the finished seeds beside it were fine-tuned from; --model {model} now holds "
                                f"another checkpoint (fingerprint {identity[1]}). Choose another "
                                "train.output_dir, or delete the folder to redo it")
        if is_main and made_from != identity:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # consolidating weights needs no GPU
            from pipeline.pretrain.export import export_checkpoint

            export_checkpoint(checkpoint, export_to, overwrite=True)
            print(f"exported {checkpoint} to {export_to} (rank {os.environ.get('RANK', '0')})", flush=True)
        barrier()
        path = export_to
    elif path.is_dir() and not (path / "config.json").exists():
        raise PipelineError(f"--model {model}: not an HF model folder (no config.json) nor a pretraining "
                            "checkpoint or output folder")
    provenance = path / PROVENANCE_FILE
    if provenance.exists():
        info = json.loads(provenance.read_text())
        return ModelSource(str(path), info.get("pretrain_run_id"), info.get("checkpoint"))
    return ModelSource(str(path))


def exported_identity(checkpoint: Path) -> tuple[str, str]:
    """What an export of `checkpoint` records of it: its path and its fingerprint."""
    return str(checkpoint), checkpoint_fingerprint(read_marker(checkpoint))


def exported_from(folder: Path) -> tuple[str, str] | None:
    """The checkpoint (path, fingerprint) an existing export was made from, or None."""
    try:
        info = json.loads((folder / PROVENANCE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return info.get("checkpoint"), info.get("checkpoint_fingerprint")
