"""Test harness: a damaged newest checkpoint and a full disk while saving, in one single-process run.

    python tests/dist/damaged_and_full_checkpoints.py CONFIG OUT_DIR

1. `first`: train.max_steps 8 with checkpoints at steps 4 and 8.
2. One bit of step 8's model file is flipped, as a failing disk would.
3. `second`: train.max_steps 12. Resume must warn about the file and fall back to step 4; retrain
   steps 5 to 8 (checkpoint 8 again), and at step 12 the disk is full (torch.save writes half the
   file, then raises ENOSPC): a PipelineError naming the folder.
4. `third`: the same command after "freeing space": resumes from step 8 and finishes.

Writes OUT_DIR/report.json with what each phase saw; the test checks it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.common.processes.topology import prepare_environment  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("out")
    args = p.parse_args()
    topology = prepare_environment()
    import torch

    from pipeline.common.errors import PipelineError
    from pipeline.common.run_layout import PretrainLayout
    from pipeline.pretrain.checkpoints import storage as checkpoints
    from pipeline.pretrain.preflight import prepare_run
    from pipeline.pretrain.trainer import run_pretraining

    out = Path(args.out)
    layout = PretrainLayout(out / "run")
    report: dict = {}

    def plan(max_steps: int):
        return prepare_run(args.config, [f"train.max_steps={max_steps}", f"train.output_dir={layout.root}"],
                                    world_size=topology.world_size, cuda=topology.cuda)

    def run(max_steps: int) -> dict:
        stderr = io.StringIO()
        started = time.perf_counter()
        result: dict = {}
        with contextlib.redirect_stderr(stderr):
            try:
                result["last_step"] = run_pretraining(plan(max_steps), topology).last_step
            except PipelineError as err:
                result["error"] = str(err)
        result["seconds"] = round(time.perf_counter() - started, 2)
        result["warnings"] = [line for line in stderr.getvalue().splitlines() if line.startswith("warning:")]
        return result

    report["first"] = run(8)
    shutil.copy(layout.metrics, out / "first-metrics.jsonl")
    model_file = layout.checkpoints / "step_00000008" / "mp_rank_00_model_states.pt"
    data = bytearray(model_file.read_bytes())
    data[len(data) // 2] ^= 0x01
    model_file.write_bytes(bytes(data))

    real_save = torch.save

    def disk_full_at_step_12(obj, path, *a, **k):
        real_save(obj, path, *a, **k)
        if "step_00000012" in str(path):
            with open(path, "r+b") as fh:
                fh.truncate(os.path.getsize(path) // 2)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    torch.save = disk_full_at_step_12
    try:
        report["second"] = run(12)
    finally:
        torch.save = real_save
    report["after_second"] = {
        "complete": [c.name for c in checkpoints.complete_checkpoints(layout.checkpoints)],
        "intact": [c.name for c in checkpoints.complete_checkpoints(layout.checkpoints) if not checkpoints.damage(c)],
        "folders": sorted(p.name for p in layout.checkpoints.iterdir())}
    report["third"] = run(12)
    events = [json.loads(line) for line in layout.metrics.read_text().splitlines()]
    report["resume_load_seconds"] = [e["resume_load_seconds"] for e in events if "resume_load_seconds" in e]
    report["checkpoint_verify_seconds"] = [e["checkpoint_verify_seconds"] for e in events
                                           if "checkpoint_verify_seconds" in e]
    (out / "report.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
