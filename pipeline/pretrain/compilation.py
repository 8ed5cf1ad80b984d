"""`train.compile`: torch.compile of the training model (preflight.py checks it before any heavy work).

DeepSpeed's `engine.compile()` calls `nn.Module.compile()`, which compiles the module in place:
the state-dict keys stay the model's own (no `_orig_mod.` prefix), so checkpoints, resume and the
HF export are the same with and without it. The sparse head's gather of masked positions has a
data-dependent size, so the head is a separate graph that inductor recompiles once with a dynamic
size and then reuses.
"""

from __future__ import annotations

# Whether `train.compile` can work here is the preflight's to say (preflight.py, `inductor_problem`); ZeRO-3
# is refused by the train section itself (config.py).


def compile_engine(engine) -> None:
    """Compile the engine's module with the accelerator's default backend (inductor on CPU and CUDA)."""
    engine.compile()
