"""torch.compile per transformer block, the way torchtitan compiles: each layer of the encoder's stack is compiled in
place and the embeddings and head stay eager.

Why not the whole model: inductor unrolls all of it, so a 24-layer model costs 24 layers of compile time (the
whole-model compile of ModernBERT-base took about 2 of a GPU row's 3 minutes). Compiled per block, dynamo traces a
layer's `forward` once and the other layers reuse that graph (they differ only in their parameters), so a deep model
compiles in about one layer's time; ModernBERT's first, local and global layers make three graphs. In place
(`nn.Module.compile`): state-dict keys stay the model's own, so checkpoints, resume and export are unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pipeline.pretrain.config import TrainConfig


def compiles(train: TrainConfig, cuda: bool) -> bool:
    """`train.compile` on this machine: true or false as written; auto compiles on a GPU that inductor can use
    (Triton installed), outside ZeRO-3."""
    if train.compile != "auto":
        return train.compile
    return cuda and train.zero_stage != 3 and inductor_problem("train.compile", "", cuda=True) is None


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers of the model's longest `ModuleList` whose items share one class: its transformer blocks."""
    stacks = [list(m) for m in model.modules()
              if isinstance(m, torch.nn.ModuleList) and len(m) > 1 and len({type(x) for x in m}) == 1]
    return max(stacks, key=len, default=[])


def compile_blocks(model: torch.nn.Module) -> int:
    """Compile each transformer block of `model` in place (the whole model where it has no stack of blocks);
    returns how many modules were compiled."""
    blocks = repeated_blocks(model) or [model]
    for block in blocks:
        block.compile()
    return len(blocks)


def inductor_problem(key: str, fix: str, *, cuda: bool) -> str | None:
    """Why inductor cannot compile here (no Triton on GPU, no C++ compiler on CPU) as a problem of `key`, or None."""
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
