"""Resuming on another number of ranks: DeepSpeed's universal checkpoint, made on demand.

A ZeRO checkpoint holds each rank's partition of the optimizer state, so it only loads on the
world size that wrote it. When the world size changes, rank 0 converts the checkpoint with
DeepSpeed's `ds_to_universal` (per-parameter fp32 weights and Adam moments, independent of the
partitioning) into `<checkpoint>/universal/`, and the engine loads it with
`checkpoint.load_universal`. The data order depends only on the optimizer step and the global
batch, so it continues unchanged.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.common.atomic_files import publish_folder
from pipeline.common.errors import PipelineError

UNIVERSAL_DIR = "universal"


def needs_universal(checkpoint: Path, saved_world_size: int, world_size: int) -> bool:
    """True when the checkpoint has per-rank optimizer partitions and the world size differs."""
    return saved_world_size != world_size and any(checkpoint.glob("*optim_states.pt"))


def convert_to_universal(checkpoint: Path) -> Path:
    """Write (once) and return the universal copy of `checkpoint`: a folder whose `<tag>/` DeepSpeed loads."""
    root = checkpoint / UNIVERSAL_DIR
    done = root / checkpoint.name / "converted"
    if done.exists():
        return root
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
    publish_folder(tmp, root)
    return root
