"""Test harness: one launch runs what an operator does to a long run, noting every batch each rank trains.

    deepspeed --num_gpus 2 tests/dist/long_run_operations.py CONFIG MIX_CONFIG OUT_ROOT

1. `full`: CONFIG as written, a checkpoint every 2 steps.
2. `rolled`: a copy of `full`, rerun with `train.skip_steps` ["6:7"]: it rolls back to step 4's
   checkpoint, trains step 5, leaves out 6 and 7, trains on to the end.
   `rolled-twice`: a copy of `rolled`, rerun with `train.skip_steps` ["3:3"] alone: it rolls back to step
   2's checkpoint, from before the first skip, which the run's ledger still leaves out; rank 1's loader is
   slowed (0.3 s a micro batch), so the logged wait share is rank 1's, not rank 0's.
3. `mixed`: MIX_CONFIG (two corpora, 1:1) for 6 steps under other block-size defaults (3 shards a
   block, as an earlier release might have had), then the same folder resumed under today's defaults,
   a 1:3 mix and half the peak LR, to the end.

Every rank writes `<name>-rank<r>.json`: {step: [sha256 of each sequence's original tokens]} and the LR.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.common.processes.topology import prepare_environment  # noqa: E402


def sequence_digests(batch) -> list[str]:
    """Each row's original tokens: the labels where the masker chose a position, the input elsewhere."""
    from pipeline.pretrain.batches.masked_slots import dense_labels

    ids, labels = batch["input_ids"].clone(), dense_labels(batch)
    chosen = labels != -100
    ids[chosen] = labels[chosen]
    return [hashlib.sha256(row.numpy().tobytes()).hexdigest()[:16] for row in ids]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("mix_config")
    p.add_argument("out_root")
    p.add_argument("--local_rank", type=int, default=None)
    args = p.parse_args()
    topology = prepare_environment()
    from pipeline.pretrain.preflight import prepare_run
    from pipeline.pretrain.trainer import Pretrainer

    root = Path(args.out_root)

    class Recording(Pretrainer):
        slow_rank_s = 0.0

        def train_step(self, batches):
            def noted():
                for batch in batches:
                    self.seen.setdefault(self.step + 1, []).extend(sequence_digests(batch))
                    if topology.rank == 1:
                        time.sleep(self.slow_rank_s)  # counted as waiting for the loader
                    yield batch

            self.lrs[self.step + 1] = self.engine.get_lr()[0]
            return super().train_step(noted())

    def run(config: str, name: str, *overrides: str, slow_rank_s: float = 0.0) -> None:
        plan = prepare_run(config, [f"train.output_dir={root / name}", *overrides], world_size=topology.world_size)
        trainer = Recording(plan, topology)
        trainer.seen, trainer.lrs, trainer.slow_rank_s = {}, {}, slow_rank_s
        trainer.train()
        out = root / f"{name}-rank{topology.rank}.json"
        before = json.loads(out.read_text()) if out.exists() else {"seen": {}, "lr": {}}
        out.write_text(json.dumps({"seen": {**before["seen"], **trainer.seen}, "lr": {**before["lr"], **trainer.lrs}}))

    run(args.config, "full")
    if topology.is_main:
        shutil.copytree(root / "full", root / "rolled", ignore=shutil.ignore_patterns("token_cache"))
    import torch.distributed as dist

    dist.barrier()
    run(args.config, "rolled", 'train.skip_steps=["6:7"]')
    if topology.is_main:
        shutil.copytree(root / "rolled", root / "rolled-twice", ignore=shutil.ignore_patterns("token_cache"))
    dist.barrier()
    run(args.config, "rolled-twice", 'train.skip_steps=["3:3"]', slow_rank_s=0.3)
    from pipeline.data import epoch_order

    defaults = epoch_order.BLOCK_TOKENS, epoch_order.MIN_BLOCK_SHARDS
    epoch_order.BLOCK_TOKENS, epoch_order.MIN_BLOCK_SHARDS = 1, 3  # another release's defaults: 3 shards a block
    run(args.mix_config, "mixed", "train.max_steps=6")
    epoch_order.BLOCK_TOKENS, epoch_order.MIN_BLOCK_SHARDS = defaults
    mix = json.loads(Path(args.mix_config).read_text())["data"]["shards"]
    mix[1]["weight"] = 3 * mix[0]["weight"]
    run(args.mix_config, "mixed", f"data.shards={json.dumps(mix)}", "optimizer.lr=0.001")


if __name__ == "__main__":
    main()
