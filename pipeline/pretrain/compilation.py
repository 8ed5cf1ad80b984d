"""`train.compile`: torch.compile of the training model, checked before any heavy work.

DeepSpeed's `engine.compile()` calls `nn.Module.compile()`, which compiles the module in place:
the state-dict keys stay the model's own (no `_orig_mod.` prefix), so checkpoints, resume and the
HF export are the same with and without it. The sparse head's gather of masked positions has a
data-dependent size, so the head is a separate graph that inductor recompiles once with a dynamic
size and then reuses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.pretrain.config import PretrainConfig


def compile_problems(config: PretrainConfig, *, cuda: bool) -> list[str]:
    """Why `train.compile` cannot work here (no compiler for inductor, an untested ZeRO stage); empty if it can."""
    problems = []
    if config.zero_stage == 3:
        # ZeRO-3 gathers each parameter in forward hooks; plain torch.compile does not trace those
        # (DeepSpeed's own answer is DeepCompile), and this pipeline has not tested the pairing.
        problems.append("train.compile with train.zero_stage 3: not supported by this pipeline "
                        "(ZeRO-3 gathers parameters in hooks that torch.compile does not trace); use stage 0-2 "
                        "or train.compile=false")
    problem = inductor_problem("train.compile", "train.compile=false", cuda=cuda)
    if problem:
        problems.append(problem)
    return problems


def inductor_problem(key: str, fix: str, *, cuda: bool) -> str | None:
    """Why inductor cannot compile here (no Triton on GPU, no C++ compiler on CPU) as a problem of `key`, or None.

    `train.compile` needs it, and so does `model.attn_implementation: flex_attention`, which transformers
    runs through torch.compile'd FlexAttention.
    """
    if cuda:
        from torch.utils._triton import has_triton

        if not has_triton():
            return f"{key}: torch.compile on GPU needs Triton, which is not installed; install triton or set {fix}"
        return None
    from torch._inductor import exc
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        return (f"{key}: torch.compile on CPU needs a C++ compiler (g++ or clang++ on PATH, or $CXX); install one "
                f"or set {fix}")
    return None


def compile_engine(engine) -> None:
    """Compile the engine's module with the accelerator's default backend (inductor on CPU and CUDA)."""
    engine.compile()
