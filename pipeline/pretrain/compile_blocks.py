"""torch.compile per transformer block, the way torchtitan compiles: each layer of the encoder's stack is compiled in
place and the embeddings and head stay eager.

Why not the whole model: inductor unrolls all of it, so a 24-layer model costs 24 layers of compile time (the
whole-model compile of ModernBERT-base took about 2 of a GPU row's 3 minutes). Compiled per block, dynamo traces a
layer's `forward` once and the other layers reuse that graph (they differ only in their parameters), so a deep model
compiles in about one layer's time; ModernBERT's first, local and global layers make three graphs. In place
(`nn.Module.compile`): state-dict keys stay the model's own, so checkpoints, resume and export are unchanged.
"""

from __future__ import annotations

import torch


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
