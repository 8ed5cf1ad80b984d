"""Test harness: a run with a batch warmup, and the same run resumed from a checkpoint inside the warmup.

    python tests/dist/batch_warmup_resume.py CONFIG OUT_ROOT STEP

`full` trains every step; `resumed` starts from a copy of `full`'s checkpoint at STEP (a run
killed there) and trains to the end. Each run writes, per optimizer step, its global batch and a
digest of every micro batch (input ids and labels) to OUT_ROOT/<run>-batches.json.
"""

from __future__ import annotations

import argparse
import hashlib
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
    p.add_argument("step", type=int)
    p.add_argument("--local_rank", type=int, default=None)
    args = p.parse_args()
    topology = prepare_environment()

    from pipeline.common.run_layout import PretrainLayout
    from pipeline.pretrain.checkpoints import storage as checkpoints
    from pipeline.pretrain.batches.masked_slots import dense_labels
    from pipeline.pretrain.preflight import prepare_run
    from pipeline.pretrain.trainer import Pretrainer

    root = Path(args.out_root)

    class Recording(Pretrainer):
        def train_step(self, micro_batches):
            def noted():
                for batch in micro_batches:
                    digest = hashlib.sha256(batch["input_ids"].numpy().tobytes() + dense_labels(batch).numpy().tobytes())
                    self.seen.setdefault(self.step + 1, {"global_batch_size": self.data.plan.global_batch_size,
                                                         "micro": []})["micro"].append(digest.hexdigest()[:16])
                    yield batch

            return super().train_step(noted())

    def run(name: str) -> None:
        plan = prepare_run(args.config, [f"train.output_dir={root / name}"],
                                      world_size=topology.world_size, cuda=topology.cuda)
        trainer = Recording(plan, topology)
        trainer.seen = {}
        trainer.train()
        (root / f"{name}-batches.json").write_text(json.dumps(trainer.seen))

    run("full")
    stopped = PretrainLayout(root / "full").checkpoints / checkpoints.tag_for(args.step)
    shutil.copytree(stopped, PretrainLayout(root / "resumed").checkpoints / stopped.name)
    run("resumed")


if __name__ == "__main__":
    main()
