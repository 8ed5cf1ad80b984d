"""Two ranks (torchrun, gloo, no DeepSpeed engine): rank 0 fails while planning, and every rank must stop, naming it.

    torchrun --nproc_per_node 2 tests/dist/rank_zero_failure.py OUT

Rank 0 fails where a run plans on rank 0 alone and the other ranks wait for its plan, each failure planted on rank 0
only, the rest of the code the run's own:
- `checkpoint`: the start's plan (`Checkpointer.confirm`): writing the run's ledger fails (a full disk);
- `rollback`: where a rollback goes (`SpikeResponse.decide`): listing the checkpoints fails (a file server's I/O
  error);
- `save`: marking a saved checkpoint complete (`save_checkpoint`): writing its record fails (a full disk);
- `replan`: the rollback's plan (`Checkpointer.carry_out`): planning the run again from the checkpoint fails.
The first three are caught here and each rank writes what it raised and after how many seconds to
`OUT/rank<R>.json`; the last is not caught, so the ranks exit with it, as a run's would.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: its helpers
from disk_full import FakeEngine  # noqa: E402
from helpers import record_at  # noqa: E402

from pipeline.common.errors import PipelineError, exit_on_pipeline_error
from pipeline.common.processes.topology import Topology
from pipeline.pretrain import checkpointer as policy
from pipeline.pretrain.checkpoints import storage
from pipeline.pretrain.checkpoints.ledger import RollbackEvent, read_ledger
from pipeline.pretrain.config import DataConfig, PretrainConfig, TrainConfig
from pipeline.pretrain.guard import spike_response
from pipeline.pretrain.guard.spike_guard import Spike
from pipeline.pretrain.guard.spike_response import Response, SpikeResponse

COLLECTIVE_TIMEOUT_S = 60
"""Shorter than a run's 300 s, long enough that a rank that waits for it is seen to hang."""


class FullDiskLedger:
    """The run's ledger on a full disk: appending to it fails."""

    def __init__(self, path: Path):
        self.path = path

    def append(self, events, write=True):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))


class Reporter:
    def say(self, message):
        print(message, file=sys.stderr)

    def report(self, step, event, message=None):
        print(message or event, file=sys.stderr)


def on_rank_zero(rank: int, failure: Exception):
    """A function that raises `failure` on rank 0 only (the other ranks never call it: they wait for rank 0)."""
    def fail(*args, **kwargs):
        if rank == 0:
            raise failure
        raise AssertionError(f"rank {rank} planned: only rank 0 plans")
    return fail


def timed(call) -> dict:
    started = time.monotonic()
    try:
        call()
    except Exception as err:  # noqa: BLE001 - what a rank raised is the result
        return {"raised": type(err).__name__, "message": str(err), "seconds": time.monotonic() - started}
    return {"raised": None, "seconds": time.monotonic() - started}


@exit_on_pipeline_error
def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    topology = Topology(rank, rank, int(os.environ["WORLD_SIZE"]), False)
    config = PretrainConfig(data=DataConfig(shards=str(out / "shards"), tokenizer=str(out / "tokenizer")),
                            train=TrainConfig(output_dir=str(out / "run"), spike_guard="rollback"))
    ledger = read_ledger(config.layout.ledger)
    checkpointer = policy.Checkpointer(config, topology, Reporter())
    results = {}

    plan = SimpleNamespace(ledger=FullDiskLedger(config.layout.ledger), unrecorded_skips=(), start_step=0)
    results["checkpoint"] = timed(lambda: checkpointer.open_run(plan))

    spike_response.complete_checkpoints = on_rank_zero(rank, OSError(errno.EIO, os.strerror(errno.EIO),
                                                                     str(config.layout.checkpoints)))
    guard = SimpleNamespace(mode="rollback", can_skip=False, forget=lambda window: None)
    response = SpikeResponse(guard, checkpointer, None, None, topology)
    spike = Spike(count=2, nonfinite=0, since=(40, 41), window=(40, 41), first=40, last=41)
    plan = SimpleNamespace(config=config, ledger=ledger, end_step=100)
    results["rollback"] = timed(lambda: response.decide(plan, None, spike, 41))

    storage.extra_state = lambda engine: {}  # what a DeepSpeed engine adds; FakeEngine has none of it
    storage.write_record = on_rank_zero(rank, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                                                      str(config.layout.checkpoints / "step_00000008")))
    results["save"] = timed(lambda: storage.save_checkpoint(FakeEngine(), config.layout.checkpoints, record_at(8), 2))

    (out / f"rank{rank}.json").write_text(json.dumps(results))
    policy.plan_after_rollback = on_rank_zero(rank, PipelineError(
        "spike guard: the rollback cannot start (checkpoint step_00000040: complete.json is damaged)"))
    (out / f"rank{rank}.replan").write_text(str(time.time()))
    rollback = Response("roll back", spike, (RollbackEvent(40, 41, (40, 41), 0, "step_00000040", 41),))
    checkpointer.carry_out(plan, rollback, None)
    print(f"rank {rank} carried out a rollback rank 0 could not plan", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
