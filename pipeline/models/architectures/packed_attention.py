"""Attention kept inside each document of a `doc-packed` row, and positions that restart per document.

A `doc-packed` row holds several framed documents (`<s> a </s><s> b </s>…<pad>…`). Computing on it
what each document would compute alone takes two things:
- **positions** restart at every document start: RoBERTa numbers them from `pad_id + 1` (transformers'
  `create_position_ids_from_input_ids`; an offset mistake silently shifts every embedding, transformers
  PR #47525), BERT and ModernBERT from 0;
- **attention** is block-diagonal, a token seeing only its own document: a boolean (batch, 1, T, T)
  mask for SDPA (additive for eager); for FlashAttention-2 the batch flattened into one row whose
  documents are varlen segments (`cu_seq_lens_*`), so no T × T mask exists; for FlexAttention a
  `BlockMask` (`create_block_mask`), which also skips fully masked blocks.

ModernBERT's local layers also keep a sliding window (`|i - j| ≤ local_attention / 2`, as transformers'
`create_bidirectional_sliding_window_mask`). Its forward takes a mask per layer type: the local layers
get the document mask and the band, the global ones the document mask alone. FlashAttention-2 applies
each layer's `sliding_window` inside each varlen segment (transformers 5 dropped ModernBERT's own
`cu_seqlens` arguments; this generic path is what its forward takes now). The FlashAttention branch
follows that documented API and was not run here (no GPU).

The flex path must never receive a dense mask: transformers' `flex_attention_forward` *adds* a tensor
mask to the scores, so a boolean mask would add 0 or 1 instead of masking and the outputs would be
silently wrong (on CPU it crashed the process); `check_flex_mask` refuses one. Padding at a row's end
forms one more "document" that attends only to itself, so no query row of a mask is empty (an
all-False row makes SDPA return NaN).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from pipeline.common.errors import PipelineError

FLEX = "flex_attention"


def document_layout(doc_starts: np.ndarray, lengths: np.ndarray, seq_len: int,
                    position_offset: int) -> tuple[np.ndarray, np.ndarray]:
    """(document ids, position ids), both (rows, seq_len) int64, for rows described by `doc_starts`.

    `doc_starts[i]` lists where row i's documents begin, then -1. Padding (positions ≥ `lengths[i]`)
    gets document id -1 and the position id `position_offset - 1` (RoBERTa's pad position).
    """
    positions = np.arange(seq_len)
    starts = np.where(doc_starts < 0, seq_len, doc_starts).astype(np.int64)  # unused slots sort last
    # The document of each position: how many starts lie at or before it, minus one.
    document = (starts[:, None, :] <= positions[None, :, None]).sum(-1) - 1
    padding = positions[None, :] >= lengths[:, None]
    start_of_mine = np.take_along_axis(starts, np.maximum(document, 0), axis=1)
    position_ids = positions[None, :] - start_of_mine + position_offset
    document = np.where(padding, -1, document)
    position_ids = np.where(padding, max(position_offset - 1, 0), position_ids)
    return document, position_ids


def block_diagonal_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """(batch, 1, T, T) boolean: True where query and key belong to the same document (padding to padding)."""
    return (document_ids[:, :, None] == document_ids[:, None, :])[:, None]


def varlen_segments(document_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Cumulative segment lengths over the flattened batch (FlashAttention's `cu_seqlens`) and the longest segment.

    A new segment starts at every row start and wherever the document id changes.
    """
    rows, length = document_ids.shape
    flat = document_ids.reshape(-1)
    change = torch.ones_like(flat, dtype=torch.bool)
    change[1:] = flat[1:] != flat[:-1]
    change[::length] = True
    starts = torch.nonzero(change).flatten()
    cu = torch.cat([starts, torch.tensor([rows * length], device=flat.device)]).to(torch.int32)
    return cu, int(cu.diff().max())


def document_mask_mod(document_ids: torch.Tensor, half_window: int | None = None):
    """FlexAttention's `mask_mod(b, h, q, kv)`: same document (padding to padding), and within `half_window` if
    given; the truth table of `block_diagonal_mask` (`& sliding_window_band`)."""
    def mask_mod(b, h, q, kv):
        same = document_ids[b, q] == document_ids[b, kv]
        return same if half_window is None else same & ((q - kv).abs() <= half_window)

    return mask_mod


def document_block_mask(document_ids: torch.Tensor, half_window: int | None = None):
    """A FlexAttention `BlockMask` for doc-packed rows (one for all heads): `document_mask_mod` over (B, T, T).

    On a GPU it is built compiled (torch.compile of `create_block_mask`, as FlexAttention's docs advise): eager, it
    is a few hundred small kernels per mask, two masks per micro batch for ModernBERT, all queued by the host."""
    from torch.nn.attention.flex_attention import create_block_mask

    rows, length = document_ids.shape
    build = _compiled_create_block_mask() if document_ids.is_cuda else create_block_mask
    return build(document_mask_mod(document_ids, half_window), rows, None, length, length, device=document_ids.device)


@functools.cache
def _compiled_create_block_mask():
    """`create_block_mask`, compiled once per process."""
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


def check_flex_mask(mask, where: str = "attention_mask") -> None:
    """Refuse a mask that transformers' flex path would add to the scores instead of applying as a mask.

    Allowed: None, a `BlockMask`, a 2-D (batch, T) padding mask (transformers builds its `BlockMask`), or a
    dict of those by layer type (ModernBERT).
    """
    from torch.nn.attention.flex_attention import BlockMask

    if isinstance(mask, dict):
        for kind, value in mask.items():
            check_flex_mask(value, f"{where}[{kind!r}]")
        return
    if mask is None or isinstance(mask, BlockMask) or (isinstance(mask, torch.Tensor) and mask.ndim == 2):
        return
    shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
    raise PipelineError(
        f"{where}: attn_implementation flex_attention was given a dense mask {shape}; transformers' flex path "
        f"adds a tensor mask to the attention scores instead of masking them, so results would be silently "
        f"wrong. Give a BlockMask (pipeline.models.architectures.packed_attention.document_block_mask) or a 2-D "
        "padding mask.")


def encoder_inputs(input_ids: torch.Tensor, document_ids: torch.Tensor, position_ids: torch.Tensor,
                   attn_implementation: str, half_window: int | None = None) -> dict:
    """Keyword arguments for an HF encoder's forward that keep attention inside documents.

    With `half_window` (ModernBERT) `attention_mask` is a dict by layer type, as ModernBertModel takes it: the
    local layers also keep the window, which inside a document is the document's own (row distance is document
    distance). For FlashAttention-2 the batch is flattened to one row (`input_ids` (1, B·T)) whose documents are
    varlen segments, and transformers hands each layer's window to the kernel; the caller reshapes the hidden
    states back to (B, T, C).
    """
    if attn_implementation == "flash_attention_2":
        cu, longest = varlen_segments(document_ids)
        return {"input_ids": input_ids.reshape(1, -1), "position_ids": position_ids.reshape(1, -1),
                "attention_mask": None, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
                "max_length_q": longest, "max_length_k": longest}
    mask = document_mask(document_ids, attn_implementation)
    if half_window is not None:
        mask = {"full_attention": mask,
                "sliding_attention": document_mask(document_ids, attn_implementation, half_window)}
    return {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": mask}


def document_mask(document_ids: torch.Tensor, attn_implementation: str, half_window: int | None = None):
    """Same document (and within `half_window`, if given) in the kernel's form: a BlockMask for flex, a boolean
    (batch, 1, T, T) mask for SDPA, an additive one for eager; on the documents' device."""
    if attn_implementation == FLEX:
        return document_block_mask(document_ids, half_window)
    mask = block_diagonal_mask(document_ids)
    if half_window is not None:
        mask = mask & sliding_window_band(document_ids.shape[1], half_window, document_ids.device)
    return _as_eager(mask) if attn_implementation == "eager" else mask


def sliding_window_band(length: int, half_window: int, device=None) -> torch.Tensor:
    """(T, T) boolean: True where query and key are at most `half_window` positions apart."""
    positions = torch.arange(length, device=device)
    return (positions[:, None] - positions[None, :]).abs() <= half_window


def _as_eager(mask: torch.Tensor) -> torch.Tensor:
    """Eager attention adds the mask to the scores: 0 where allowed, the dtype's minimum elsewhere; on the
    mask's own device (a CPU tensor here failed every eager packed step on CUDA)."""
    return torch.zeros(mask.shape, device=mask.device).masked_fill_(~mask, torch.finfo(torch.float32).min)
