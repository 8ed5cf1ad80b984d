"""Test harness: one launch trains each masking / optimizer / model variant, then resumes it from its middle.

    deepspeed --num_gpus 2 tests/dist/train_recipe_variants.py CONFIG OUT_ROOT [DOC_PACKED_SHARDS]
    python tests/dist/train_recipe_variants.py CONFIG OUT_ROOT [DOC_PACKED_SHARDS]

For every variant: `OUT_ROOT/NAME/full` trains `train.max_steps` steps, checkpointing halfway;
then `OUT_ROOT/NAME/resumed` starts from a copy of that halfway checkpoint alone (a run stopped
there) and trains to the end with freshly built data loaders, masker and engine. The test compares
their losses, and the 1-process launch with the 2-rank one. One launch for all variants saves a
process-group start-up (~15 s here) per variant. The modernbert variant (ZeRO-2, 30% masking, one
global and two windowed layers) trains on DOC_PACKED_SHARDS when given, so its per-document
attention and window run inside the real loop; so does the contrastive one (the span loss beside the MLM loss,
ZeRO-1), whose spans are drawn from the packed documents.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.common.processes.topology import prepare_environment  # noqa: E402

VARIANTS = {
    "word": ["masking.unit=word"],
    "span_static_30": ["masking.unit=span", "masking.mode=static", "masking.probability=0.3"],
    "lamb": ["optimizer.name=lamb", "optimizer.lr=0.01"],
    "lamb_zero2": ["optimizer.name=lamb", "optimizer.lr=0.01", "train.zero_stage=2"],
    "prelayernorm": ["model.architecture=roberta-prelayernorm", "masking.unit=word", "train.export=true"],
    "modernbert": ["model.architecture=modernbert", "model.num_hidden_layers=3", "model.intermediate_size=96",
                   "model.local_attention=16", "masking.probability=0.3", "train.zero_stage=2",
                   "train.export=true"],
    "contrastive": ["model.architecture=modernbert", "contrastive.weight=1.0", "contrastive.min_tokens=4",
                    "train.zero_stage=1"],
}
PACKED = ("modernbert", "contrastive")
"""The variants that train on DOC_PACKED_SHARDS when given."""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("out_root")
    p.add_argument("doc_packed_shards", nargs="?", default=None)
    p.add_argument("--local_rank", type=int, default=None)
    args = p.parse_args()
    topology = prepare_environment()
    import torch.distributed as dist

    from pipeline.common.run_layout import PretrainLayout
    from pipeline.pretrain.checkpoints import storage as checkpoints
    from pipeline.pretrain.preflight import prepare_run
    from pipeline.pretrain.trainer import run_pretraining

    for name, overrides in VARIANTS.items():
        if name in PACKED and args.doc_packed_shards:
            overrides = [*overrides, f"data.shards={args.doc_packed_shards}"]
        root = Path(args.out_root) / name
        full = prepare_run(args.config, [*overrides, f"train.output_dir={root / 'full'}"],
                                    world_size=topology.world_size, cuda=topology.cuda)
        run_pretraining(full, topology)
        halfway = PretrainLayout(root / "full").checkpoints / checkpoints.tag_for(full.config.checkpoint.every)
        resumed_root = PretrainLayout(root / "resumed").checkpoints
        if topology.is_main:
            shutil.copytree(halfway, resumed_root / halfway.name)
        dist.barrier()
        resumed = prepare_run(args.config, [*overrides, f"train.output_dir={root / 'resumed'}"],
                                       world_size=topology.world_size, cuda=topology.cuda)
        run_pretraining(resumed, topology)


if __name__ == "__main__":
    main()
