"""The one training engine under fine-tuning and the Kit: an accelerate `Accelerator` for a precision.

`precision` is the pipeline's one spelling (`pipeline.models.precision`).
"""

from __future__ import annotations

from datetime import timedelta

import torch

from pipeline.models.precision import Precision, accelerate_precision


def build_accelerator(precision: Precision, *, accumulation: int = 1, world_size: int = 1, cpu: bool | None = None,
                      collective_timeout_s: float | None = None):
    """An `Accelerator` for this process: gloo on CPU, NCCL on GPUs, one process without a group.

    accelerate keeps one mixed-precision setting per process and refuses a second `Accelerator` with
    another ("AcceleratorState has already been initialized and cannot be changed"). In one process
    (a notebook building a bf16 Kit trainer, then an fp32 one) that state is reset first, as
    accelerate's own tests do between cases; the process group of a multi-process run is never reset.
    The accumulation is process-wide too (accelerate's `GradientState`): an `Accelerator` serves one
    training at a time, and the next training builds its own.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    cpu = not torch.cuda.is_available() if cpu is None else cpu
    wanted = accelerate_precision(precision)
    if world_size == 1 and AcceleratorState._shared_state:
        state = AcceleratorState()
        if state.mixed_precision != wanted or (state.device.type == "cpu") != cpu:
            AcceleratorState._reset_state(reset_partial_state=True)
    handler = _process_group(world_size, cpu, collective_timeout_s)
    return Accelerator(cpu=cpu, mixed_precision=wanted, gradient_accumulation_steps=accumulation,
                       kwargs_handlers=[handler] if handler else [])


def processes(*, world_size: int = 1, collective_timeout_s: float | None = None):
    """This process among the run's (accelerate's `PartialState`: which is the main one, a barrier), the process
    group made as `build_accelerator` makes it: what a run does between its trainings needs no `Accelerator`."""
    from accelerate import PartialState

    cpu = not torch.cuda.is_available()
    handler = _process_group(world_size, cpu, collective_timeout_s)
    return PartialState(cpu=cpu, **(handler.to_kwargs() if handler else {}))


def _process_group(world_size: int, cpu: bool, collective_timeout_s: float | None):
    """How several processes meet: gloo on CPU, NCCL on GPUs, collectives bounded by the timeout; None for one.

    Without cpu=True, processes started by `accelerate launch` on a machine with no GPU each train alone
    (DistributedType.NO); with it they form a gloo group (MULTI_CPU). The timeout bounds every collective
    (accelerate's own default is torch's 30 minutes on gloo). One process has no group: a backend named
    there would make accelerate look for one.
    """
    from accelerate.utils import InitProcessGroupKwargs

    if world_size == 1:
        return None
    timeout = {"timeout": timedelta(seconds=collective_timeout_s)} if collective_timeout_s else {}
    return InitProcessGroupKwargs(backend="gloo" if cpu else "nccl", **timeout)


def bare_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DistributedDataParallel and torch.compile's wrapper.

    accelerate's `unwrap_model` and `get_state_dict` do this too, but their first call imports DeepSpeed
    to look for its engine (7 s on a 2-core CPU, in every fine-tuning process); fine-tuning never uses it.
    """
    from torch.nn.parallel import DistributedDataParallel

    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model
