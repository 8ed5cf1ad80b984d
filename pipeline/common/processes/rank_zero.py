"""Rank 0 decides, and every rank learns the outcome: the decision, or the error that stopped it.

Some choices are made once, by rank 0, from files that a shared file system may show the ranks differently for a
while (what a start sets aside, where a rollback goes), and broadcast to the others. The others wait in that
broadcast: an error that stops rank 0 before it broadcasts would leave them waiting until rank 0's process ends
(or, while it lives on, until the collective timeout, `train.collective_timeout_s`), and then name a lost rank, not
the error. So a failure is what rank 0 broadcasts instead, and every rank raises at once, naming it.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import TypeVar

from pipeline.common.errors import PipelineError
from pipeline.common.processes.topology import Topology

T = TypeVar("T")


def decided_on_rank_zero(decide: Callable[[], T], what: str, topology: Topology | None = None) -> T:
    """`decide()`'s value, computed on rank 0 and given to every rank. If it raises on rank 0, rank 0 raises it and
    every other rank raises a PipelineError naming it and `what` rank 0 was doing ("planning a rollback").
    `topology`: this rank's place (None: the default process group's, or a world of one without one)."""
    import torch.distributed as dist

    if topology is None:
        grouped = dist.is_available() and dist.is_initialized()
        topology = Topology(dist.get_rank(), 0, dist.get_world_size(), False) if grouped else Topology(0, 0, 1, False)
    if topology.world_size == 1:
        return decide()
    failure: Exception | None = None
    shared: list[tuple[T | None, str | None]] = [(None, None)]
    if topology.is_main:
        try:
            value = decide()
            pickle.dumps(value)  # a value that cannot be sent fails here, where the others can be told
            shared = [(value, None)]
        except Exception as err:
            failure = err
            shared = [(None, describe(err))]
    dist.broadcast_object_list(shared, src=0)
    if failure is not None:
        raise failure
    value, failed = shared[0]
    if failed is not None:
        raise PipelineError(f"rank {topology.rank} of {topology.world_size} stops: rank 0 failed while {what}: "
                            f"{failed} (rank 0's log has the whole error)")
    return value


def describe(err: Exception) -> str:
    """`err` in bounded text: a PipelineError's message as it stands (it is written for the user), else its type
    and message."""
    text = str(err) if isinstance(err, PipelineError) else f"{type(err).__name__}: {err}"
    return text if len(text) <= 2000 else text[:2000] + " …"
