"""Test harness: one launch runs the spike guard's remedies against a clean run, noting every batch each rank trains.

    python tests/dist/spike_guard_runs.py CONFIG OUT_ROOT                       (1 rank)
    deepspeed --num_gpus 2 tests/dist/spike_guard_runs.py CONFIG OUT_ROOT       (2 ranks)

CONFIG trains 16 steps, a checkpoint every 4, the guard's window 8 steps (judging after 4), logging every step.
1. `clean`: the guard off.
2. `skip`: `train.spike_guard skip` with a spike planted at step 10 (`train.inject_spike` 10:1e4); the weights,
   the AdamW moments and step counters are noted before and after steps 9 and 10.
3. `rollback`: `train.spike_guard rollback` after each outlier (`guard.rollback_after` 1), spikes planted at
   steps 10, 14 and 15, `guard.max_rollbacks` 2: back to step 8 (step 9 again, 10 left out), then to step 12 (13
   again, 14 left out: the same spike, within a window of 10), then it gives up at 15 (its message noted). On 2
   ranks, rank 1 sees no checkpoint at all (a shared file system behind): rank 0 decides for both.
   `rollback-resumed`: the same folder rerun without a spike: it resumes at 12 and trains to the end.
4. `rollback-after-2`: the default `guard.rollback_after` 2, spikes at 10 and 14: the first outlier's update is
   left out (as `skip` leaves it; the states noted over steps 9 and 10), the second sends the run back to step 8
   (from before the first), leaving out 10-14, so step 12's checkpoint is set aside.
5. `rollback-zero2`: `rollback` at ZeRO stage 2 (DeepSpeed's partitioned optimizer loaded again in the same
   process), a spike at step 10.
6. `two-spikes`: `guard.max_rollbacks` 1, a NaN loss at step 3 (no checkpoint behind the run yet: its update is
   left out and the run goes on), spikes at 6 and 15: two spikes a clean window apart, each rolled back once.
7. `level-shift`: 8 steps, then the same folder resumed to 16 with another peak LR and every later loss tripled (a
   change of level, not a spike): the window re-arms at the resume, so nothing is rolled back.

Every rank writes `<name>-rank<r>.json`: the steps trained in order, with the sha256 of each sequence's original
tokens, the LR of each, and (skip, rollback-after-2) the largest change of each state over steps 9 and 10.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from long_run_operations import sequence_digests  # noqa: E402

from pipeline.common.processes.topology import prepare_environment  # noqa: E402

FACTOR = 1e4


class Spikes:
    """A drill (spike_guard.Drill) multiplying the loss at each of several steps (by `factors`, else FACTOR), or at
    every step from `shift_from` on (a change of level)."""

    def __init__(self, steps: set[int], factors: dict[int, float] | None = None, shift_from: int | None = None):
        self.steps, self.factors, self.shift_from = steps, factors or {}, shift_from

    def scaled(self, loss, step: int):
        if self.shift_from is not None and step >= self.shift_from:
            return loss * 3.0
        return loss * self.factors.get(step, FACTOR) if step in self.steps else loss


def optimizer_state(engine) -> dict[str, list]:
    """The model's weights and torch AdamW's moments and step counters, copied."""
    params = list(engine.module.parameters())
    state = [engine.optimizer.state[p] for p in params]
    return {"weights": [p.detach().clone() for p in params],
            "exp_avg": [s["exp_avg"].clone() for s in state], "exp_avg_sq": [s["exp_avg_sq"].clone() for s in state],
            "step": [s["step"].clone() for s in state]}


def largest_change(before: dict[str, list], after: dict[str, list]) -> dict[str, float]:
    return {key: max(float((a - b).abs().max()) for a, b in zip(after[key], before[key], strict=True))
            for key in before}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("out_root")
    p.add_argument("--local_rank", type=int, default=None)
    args = p.parse_args()
    topology = prepare_environment()
    import torch.distributed as dist

    from pipeline.pretrain.preflight import prepare_run
    from pipeline.pretrain.guard.spike_response import GiveUp
    from pipeline.pretrain.trainer import Pretrainer

    root = Path(args.out_root)

    class Recording(Pretrainer):
        def train_step(self, batches):
            def noted():
                for batch in batches:
                    self.trained[-1][1].extend(sequence_digests(batch))
                    yield batch

            step = self.step + 1
            self.trained.append((step, []))
            self.lrs[step] = self.engine.get_lr()[0]
            before = optimizer_state(self.engine) if step in self.watched else None
            lr = super().train_step(noted())
            if before is not None:
                self.changes[step] = largest_change(before, optimizer_state(self.engine))
            return lr

    def run(name: str, *overrides: str, spikes: set[int] = frozenset(), watched: set[int] = frozenset(),
            drill: Spikes | None = None, into: str | None = None) -> None:
        plan = prepare_run(args.config, [f"train.output_dir={root / (into or name)}", *overrides],
                           world_size=topology.world_size)
        trainer = Recording(plan, topology)
        trainer.trained, trainer.lrs, trainer.changes, trainer.watched = [], {}, {}, watched
        if spikes or drill:
            trainer.drill = drill or Spikes(spikes)
        stopped = None
        try:
            trainer.train()
        except GiveUp as err:
            stopped = str(err)
        (root / f"{name}-rank{topology.rank}.json").write_text(json.dumps(
            {"trained": trainer.trained, "lr": trainer.lrs, "changes": trainer.changes, "gave_up": stopped}))

    run("clean")
    run("skip", "train.spike_guard=skip", "train.inject_spike=10:1e4", watched={9, 10})
    rollback = ("train.spike_guard=rollback", "guard.rollback_after=1")
    if topology.rank == 1:  # this rank sees no checkpoint: only rank 0's view may decide
        import pipeline.pretrain.guard.spike_response as response

        seen, response.complete_checkpoints = response.complete_checkpoints, lambda root: []
    run("rollback", *rollback, "guard.max_rollbacks=2", spikes={10, 14, 15})
    if topology.rank == 1:
        response.complete_checkpoints = seen
    if topology.is_main:
        shutil.copytree(root / "rollback", root / "rollback-resumed", ignore=shutil.ignore_patterns("token_cache"))
    dist.barrier()
    run("rollback-resumed", *rollback, "guard.max_rollbacks=2")
    run("rollback-after-2", "train.spike_guard=rollback", spikes={10, 14}, watched={9, 10})
    run("rollback-zero2", *rollback, "train.zero_stage=2", spikes={10})
    run("two-spikes", *rollback, "guard.max_rollbacks=1",
        drill=Spikes({3, 6, 15}, factors={3: float("nan")}))
    run("level-shift", *rollback, "train.max_steps=8")
    run("level-shift-resumed", *rollback, "optimizer.lr=0.003", into="level-shift", drill=Spikes(set(), shift_from=9))


if __name__ == "__main__":
    main()
