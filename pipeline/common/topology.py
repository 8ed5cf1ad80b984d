"""Process-group set-up that works the same under `deepspeed`, `torchrun` and plain `python`."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    rank: int
    local_rank: int
    world_size: int
    cuda: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    """A TCP port nobody listens on now, for a rendezvous on this machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def current_topology() -> Topology:
    """This process's rank and world as its launcher (deepspeed, torchrun, accelerate) set them; a
    world of one without a launcher. Reads the environment and changes nothing."""
    import torch

    world = int(os.environ.get("WORLD_SIZE", 1))
    return Topology(int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), world,
                    torch.cuda.is_available())


def prepare_environment() -> Topology:
    """Read (or, for plain `python`, invent) the launcher's variables; pick the accelerator.

    Must run before `import deepspeed`: DeepSpeed chooses its accelerator at import time, and
    without DS_ACCELERATOR=cpu on a machine with no GPU it goes looking for one.
    """
    import torch

    if "RANK" not in os.environ:  # plain `python`: a world of one
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    topology = current_topology()
    if not topology.cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", topology.world_size))
    if topology.cuda:
        torch.cuda.set_device(topology.local_rank)
    elif "OMP_NUM_THREADS" not in os.environ:
        # Ranks sharing a CPU would otherwise each start one thread per core and fight over them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    return topology


def init_process_group(topology: Topology) -> None:
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if topology.cuda else "gloo")

