"""Test harness: one launch trains the same tiny config under ZeRO 0, 1, 2 and 3 in turn.

    deepspeed --num_gpus 2 tests/dist/train_each_zero_stage.py CONFIG OUT_ROOT
    python tests/dist/train_each_zero_stage.py CONFIG OUT_ROOT

Sharing one launch between four runs saves three process-group start-ups (~15 s each here).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.common.processes.topology import prepare_environment  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("out_root")
    p.add_argument("--local_rank", type=int, default=None)
    args = p.parse_args()
    topology = prepare_environment()
    from pipeline.pretrain.preflight import prepare_run
    from pipeline.pretrain.trainer import run_pretraining

    for stage in (0, 1, 2, 3):
        overrides = [f"train.zero_stage={stage}", f"train.output_dir={args.out_root}/zero{stage}"]
        plan = prepare_run(args.config, overrides, world_size=topology.world_size, cuda=topology.cuda)
        run_pretraining(plan, topology)


if __name__ == "__main__":
    main()
