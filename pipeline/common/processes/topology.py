"""Process-group set-up that works the same under `deepspeed`, `torchrun` and plain `python`."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path


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


def environment_extensions_dir() -> Path | None:
    """Where this Python environment keeps its JIT-compiled torch extensions: `<venv>/torch_extensions`.

    None outside a virtual environment (a system prefix is not ours to write to): torch's default
    `~/.cache/torch_extensions` then applies.
    """
    if sys.prefix == sys.base_prefix:
        return None
    return Path(sys.prefix) / "torch_extensions"


def use_environment_extensions_dir() -> None:
    """Point TORCH_EXTENSIONS_DIR at this environment's own folder, unless the user has set it.

    DeepSpeed JIT-compiles its CPU shared-memory comm op (about 70 s) into the extensions folder.
    torch's default, `~/.cache/torch_extensions/py311_cpu/<op>`, is keyed by Python version and op
    name, not by environment, and its build file names the building environment's include paths:
    two environments that take turns rebuild the op on every launch. launchers/setup_env.sh
    exports the same folder for shell commands.
    """
    folder = environment_extensions_dir()
    if folder is not None:
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(folder))


def prepare_environment() -> Topology:
    """Read (or, for plain `python`, invent) the launcher's variables; pick the accelerator.

    Must run before `import deepspeed`: DeepSpeed chooses its accelerator at import time, and
    without DS_ACCELERATOR=cpu on a machine with no GPU it goes looking for one; its comm op is
    built or loaded from TORCH_EXTENSIONS_DIR when the process group starts.
    """
    import torch

    use_environment_extensions_dir()

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
    import_deepspeed()
    return topology


def import_deepspeed():
    """`import deepspeed`, without the import of mlflow its autotuner makes when mlflow is installed.

    The autotuner never runs here, and importing mlflow is about 2 s of deepspeed's 5-7 s (more on a loaded
    machine), paid by every pretraining process with tracking off too. The pipeline's MLflow sink imports
    mlflow itself when tracking is on. Hidden only while deepspeed loads: a later `import mlflow` works.
    """
    import sys

    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    hide = "mlflow" not in sys.modules
    if hide:
        sys.modules["mlflow"] = None  # `import mlflow` raises ImportError, which deepspeed's autotuner allows
    try:
        import deepspeed
    finally:
        if hide:
            del sys.modules["mlflow"]
    return deepspeed


def init_process_group(topology: Topology, timeout_s: float) -> None:
    """The default process group; every collective on it gives up after `timeout_s` (see common/lost_rank.py)."""
    from datetime import timedelta

    deepspeed = import_deepspeed()
    if not topology.cuda:
        skip_shared_memory_comm_op()
    deepspeed.init_distributed(dist_backend="nccl" if topology.cuda else "gloo", timeout=timedelta(seconds=timeout_s))


SHARED_MEMORY_COMM_OP = "deepspeed_shm_comm"
"""DeepSpeed's CPU shared-memory all-reduce op (`ShareMemCommBuilder.NAME`)."""


def skip_shared_memory_comm_op() -> None:
    """Keep DeepSpeed from building (or loading) its CPU shared-memory comm op when the process group starts.

    DeepSpeed's CPU backend JIT-compiles that op on its first start in an environment (40-70 s on 2 cores, inside the
    first pretraining's clock), but calls it only from `inference_all_reduce`, its tensor-parallel inference path:
    training's all-reduces, all-gathers and reduce-scatters go through torch.distributed (gloo here) either way.
    Marked incompatible, the op is neither built nor loaded and nothing else changes; benchmarks/cpu_allreduce.py
    measures both all-reduces. `deepspeed.ops.__compatible_ops__` is DeepSpeed's one dict of which ops may load
    (probed on first access, then kept), which its backend reads when it starts.
    """
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[SHARED_MEMORY_COMM_OP] = False

