"""Test harness: one launch trains a ModernBERT context-extension run and StableAdamW under ZeRO 0, 1 and 2.

    python tests/dist/train_schedules_and_stableadamw.py PHASED_CONFIG FLAT_CONFIG OUT_ROOT RESUME_STEP

`OUT_ROOT/phased/full` trains PHASED_CONFIG (WSD schedule, StableAdamW, a second phase raising the RoPE
theta, validation at another masking rate) to the end, checkpointing every step; `OUT_ROOT/phased/resumed`
starts from a copy of its checkpoint at RESUME_STEP alone and trains to the end with a freshly built model,
engine and data. `OUT_ROOT/zeroN` trains FLAT_CONFIG under ZeRO stage N. One launch saves a process-group
start-up (~15 s here) per run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.common.processes.topology import prepare_environment  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("phased_config")
    p.add_argument("flat_config")
    p.add_argument("out_root")
    p.add_argument("resume_step", type=int)
    p.add_argument("--local_rank", type=int, default=None)
    args = p.parse_args()
    topology = prepare_environment()
    import torch

    from pipeline.common.run_layout import PretrainLayout
    from pipeline.pretrain.checkpoints import storage as checkpoints
    from pipeline.pretrain.preflight import prepare_run
    from pipeline.pretrain.trainer import run_pretraining

    root = Path(args.out_root)

    def load(path: str, out: Path, *extra: str):
        return prepare_run(path, [f"train.output_dir={out}", *extra], world_size=topology.world_size,
                                    cuda=topology.cuda)

    run_pretraining(load(args.phased_config, root / "phased" / "full"), topology)
    stopped = PretrainLayout(root / "phased" / "full").checkpoints / checkpoints.tag_for(args.resume_step)
    if topology.is_main:
        shutil.copytree(stopped, PretrainLayout(root / "phased" / "resumed").checkpoints / stopped.name)
    torch.distributed.barrier()
    run_pretraining(load(args.phased_config, root / "phased" / "resumed"), topology)
    for stage in (0, 1, 2):
        run_pretraining(load(args.flat_config, root / f"zero{stage}", f"train.zero_stage={stage}"),
                        topology)


if __name__ == "__main__":
    main()
