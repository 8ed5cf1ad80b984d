"""Test harness: one launch trains the tiny variant of each shipped recipe in configs/recipes/.

    deepspeed --num_gpus 2 tests/dist/train_shipped_recipes.py PLAN OUT_ROOT
    python tests/dist/train_shipped_recipes.py PLAN OUT_ROOT

PLAN is a JSON object {recipe file: [--set overrides]}; each recipe trains into OUT_ROOT/<its stem>
with exactly those overrides on top of the shipped file. One process group for all the recipes
saves a launch (~30 s under `deepspeed` here) per recipe.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.common.processes.topology import prepare_environment  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("plan")
    p.add_argument("out_root")
    p.add_argument("--local_rank", type=int, default=None)
    args = p.parse_args()
    topology = prepare_environment()

    from pipeline.pretrain.preflight import prepare_run
    from pipeline.pretrain.trainer import run_pretraining

    for recipe, overrides in json.loads(Path(args.plan).read_text()).items():
        output = Path(args.out_root) / Path(recipe).stem
        plan = prepare_run(recipe, [*overrides, f"train.output_dir={output}"],
                                      world_size=topology.world_size, cuda=topology.cuda)
        run_pretraining(plan, topology)


if __name__ == "__main__":
    main()
