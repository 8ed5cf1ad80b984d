"""Test harness: one launch trains a two-phase run, then resumes it at and after the phase boundary.

    python tests/dist/train_two_phases.py CONFIG OUT_ROOT BOUNDARY

`OUT_ROOT/full` trains every step, checkpointing after each, and records the optimizer state and
the engine's batch settings on both sides of its hand-over in `OUT_ROOT/handover.json`. Then
`OUT_ROOT/at_BOUNDARY` starts from a copy of the checkpoint at the last step of phase 1 alone (a
run stopped there) and `OUT_ROOT/after_BOUNDARY` from the one a step into phase 2; both train to
the end with freshly built data, masker and engine. One launch saves a start-up per run.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.common.processes.topology import prepare_environment  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("out_root")
    p.add_argument("boundary", type=int)
    p.add_argument("--local_rank", type=int, default=None)
    args = p.parse_args()
    topology = prepare_environment()
    import torch

    from pipeline.common.run_layout import PretrainLayout
    from pipeline.pretrain.checkpoints import storage as checkpoints
    from pipeline.pretrain.preflight import prepare_run
    from pipeline.pretrain.trainer import Pretrainer, run_pretraining

    class RecordingHandOver(Pretrainer):
        """The full run, noting what the hand-over kept and changed."""

        def start(self, plan, batches=None, *, handing_over=False):
            if not handing_over:  # the run's start, not a hand-over
                return super().start(plan, batches, handing_over=handing_over)
            engine = self.engine
            before = copy.deepcopy(engine.optimizer.state_dict()["state"])
            batch_before = [engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()]
            batches = super().start(plan, batches, handing_over=handing_over)
            after = engine.optimizer.state_dict()["state"]
            moments = [float((before[i][k] - after[i][k]).abs().max()) for i in before
                       for k in ("exp_avg", "exp_avg_sq")]
            record = {"step": self.step, "moment_tensors": len(moments), "max_moment_change": max(moments),
                      "nonzero_moments": sum(bool(before[i]["exp_avg"].abs().sum() > 0) for i in before),
                      "batch_before": batch_before,
                      "batch_after": [engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()],
                      "train_batch_size_after": engine.train_batch_size()}
            if self.topology.is_main:
                Path(args.out_root, "handover.json").write_text(json.dumps(record))
            return batches

    root = Path(args.out_root)

    def load(name: str, *extra: str):
        return prepare_run(args.config, [f"train.output_dir={root / name}", *extra],
                                    world_size=topology.world_size, cuda=topology.cuda)

    full = load("full", "tracking.enabled=true")
    RecordingHandOver(full, topology).train()
    for name, step in ((f"at_{args.boundary}", args.boundary), (f"after_{args.boundary}", args.boundary + 1)):
        stopped = PretrainLayout(root / "full").checkpoints / checkpoints.tag_for(step)
        if topology.is_main:
            shutil.copytree(stopped, PretrainLayout(root / name).checkpoints / stopped.name)
        torch.distributed.barrier()
        run_pretraining(load(name), topology)


if __name__ == "__main__":
    main()
