"""Test harness: a stable run, an anneal from its middle checkpoint, and that anneal resumed mid-decay.

    python tests/dist/anneal_from_checkpoint.py CONFIG OUT_ROOT START STEPS

1. `stable`: the config as written, a checkpoint every few steps.
2. `anneal`: `train.anneal_from=stable/checkpoints/step_START`, `train.anneal_steps=STEPS`.
3. `resumed`: a copy of `anneal` cut back to its first checkpoint after START (as if killed there),
   rerun with the same config: it resumes from its own checkpoint, not from the stable run's.

Each run records, per optimizer step, a digest of every micro batch's input ids and labels (the
data stream) in OUT_ROOT/<run>-batches.json; losses and LRs are in each run's metrics.jsonl.
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
    p.add_argument("start", type=int)
    p.add_argument("steps", type=int)
    args = p.parse_args()
    topology = prepare_environment()

    from pipeline.common.config.tree import ConfigError
    from pipeline.common.run_layout import PretrainLayout
    from pipeline.pretrain.checkpoints import storage as checkpoints
    from pipeline.pretrain.batches.masked_slots import dense_labels
    from pipeline.pretrain.preflight import load_pretrain_config, prepare_run
    from pipeline.pretrain.trainer import Pretrainer

    root = Path(args.out_root)

    class Recording(Pretrainer):
        """Notes each step's micro batches as they are trained."""

        def train_step(self, micro_batches):
            def noted():
                for batch in micro_batches:
                    digest = hashlib.sha256(batch["input_ids"].numpy().tobytes() + dense_labels(batch).numpy().tobytes())
                    self.seen.setdefault(self.step + 1, []).append(digest.hexdigest()[:16])
                    yield batch

            return super().train_step(noted())

    def run(name: str, *overrides: str) -> None:
        plan = prepare_run(args.config, [f"train.output_dir={root / name}", *overrides],
                                      world_size=topology.world_size, cuda=topology.cuda)
        trainer = Recording(plan, topology)
        trainer.seen = {}
        trainer.train()
        (root / f"{name}-batches.json").write_text(json.dumps(trainer.seen))

    run("stable")
    source = PretrainLayout(root / "stable").checkpoints / checkpoints.tag_for(args.start)
    anneal = [f"train.anneal_from={json.dumps(str(source))}", f"train.anneal_steps={args.steps}"]
    try:  # the stable run trained with AdamW: an anneal under StableAdamW is refused before it starts
        load_pretrain_config(args.config, [f"train.output_dir={root / 'refused'}", *anneal,
                                           "optimizer.name=stableadamw"], world_size=topology.world_size,
                             cuda=topology.cuda)
    except ConfigError as err:
        (root / "refused.txt").write_text(str(err))
    run("anneal", *anneal)
    shutil.copytree(root / "anneal", root / "resumed")
    done = checkpoints.complete_checkpoints(PretrainLayout(root / "resumed").checkpoints)
    for folder in done[1:]:  # keep the anneal's first checkpoint only: a run killed after it
        shutil.rmtree(folder)
    (root / "resumed-from.txt").write_text(done[0].name)
    run("resumed", *anneal)


if __name__ == "__main__":
    main()
