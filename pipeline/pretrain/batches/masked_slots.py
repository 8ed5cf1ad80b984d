"""A micro batch's masked positions in a fixed number of slots, so the MLM head has a static shape.

The training models apply the MLM head at masked positions only (model.py). Picking them with a boolean mask
(`hidden[labels != -100]`) is a `nonzero` on the device: a device→host sync each micro batch, and a shape that
changes with every batch, so a compiled graph goes dynamic. Instead the collator lists them on the host:

- `masked_positions` (int64, `slots`): flat indices into the batch's rows × seq_len, row-major;
- `masked_labels` (int64, `slots`): the original token at each, IGNORE_INDEX in the slots left over.

Leftover slots point at position 0 and are ignored by the cross-entropy, so they change neither the loss nor
the gradients. `slots` depends only on the batch's shape and the masking config (`slot_bound`); a batch that
draws more masked positions than that gets the next bucket (`slot_count`), never a truncated mask.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pipeline.pretrain.config import MaskingConfig
from pipeline.pretrain.plan.masking import IGNORE_INDEX
from pipeline.pretrain.span_lengths import span_length_distribution

SLOT_MULTIPLE = 64
"""Slot counts are multiples of this: whole tiles for the head's matrix multiplies."""

MARGIN_SIGMAS = 6.0
"""Standard deviations of the masked count above its mean that the bound covers (one batch in ~10^9 beyond)."""

WORD_TOKENS = 2.0
"""The token-weighted mean length of a word in tokens, assumed by the bound for whole-word and span masking."""


def round_up(n: float, multiple: int = SLOT_MULTIPLE) -> int:
    """`n` rounded up to a multiple of `multiple` (at least one multiple)."""
    return max(multiple, multiple * math.ceil(n / multiple))


def unit_tokens(masking: MaskingConfig) -> float:
    """The token-weighted mean size, in tokens, of what the masker chooses at once: 1 for a token, a word's
    tokens for whole words, a span's for spans (E[L²] / E[L] of the span lengths L, in words, × `WORD_TOKENS`)."""
    if masking.unit == "token":
        return 1.0
    if masking.unit == "word":
        return WORD_TOKENS
    weights = span_length_distribution(masking.span_p, masking.span_max_words)
    words = np.arange(1, masking.span_max_words + 1)
    return WORD_TOKENS * float(weights @ words**2 / (weights @ words))


def slot_bound(tokens: int, probability: float, masking: MaskingConfig) -> int:
    """The slots of a micro batch of `tokens` positions masked at `probability` by `masking`'s unit.

    The masked count has mean at most `tokens · p`; chosen in units of c tokens on average (token-weighted,
    `unit_tokens`), each unit independently with probability p, its variance is `tokens · p · (1 − p) · c`.
    The bound is the mean plus `MARGIN_SIGMAS` of those standard deviations, rounded up to `SLOT_MULTIPLE`,
    and never more than every position (rounded up).
    """
    mean = tokens * probability
    sigma = math.sqrt(tokens * probability * (1 - probability) * unit_tokens(masking))
    return min(round_up(mean + MARGIN_SIGMAS * sigma), round_up(tokens))


def slot_count(masked: int, bound: int, tokens: int) -> int:
    """The slots for a batch that masked `masked` of its `tokens` positions: `bound`, or if that is too few the
    first bucket of `bound` doubled that holds them (capped at every position, which always does).

    Each bucket is a static shape of its own: a compiled model recompiles once for it.
    """
    slots = bound
    while slots < masked:
        slots *= 2
    return min(slots, round_up(tokens))


def masked_slots(labels: np.ndarray | torch.Tensor, bound: int | None = None) -> dict[str, torch.Tensor]:
    """`masked_positions` and `masked_labels` of per-position `labels` (IGNORE_INDEX where nothing is predicted).

    `bound`: the batch's `slot_bound`; None (a hand-made batch, whose shape need not repeat) gives the masked
    count rounded up to `SLOT_MULTIPLE`.
    """
    flat = np.asarray(labels).reshape(-1)
    positions = np.flatnonzero(flat != IGNORE_INDEX)
    slots = round_up(len(positions)) if bound is None else slot_count(len(positions), bound, flat.size)
    masked_positions = np.zeros(slots, dtype=np.int64)
    masked_labels = np.full(slots, IGNORE_INDEX, dtype=np.int64)
    masked_positions[: len(positions)] = positions
    masked_labels[: len(positions)] = flat[positions]
    return {"masked_positions": torch.from_numpy(masked_positions), "masked_labels": torch.from_numpy(masked_labels)}


def dense_labels(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The batch's labels per position, shaped like `input_ids`: the target where masked, IGNORE_INDEX elsewhere."""
    labels = torch.full(batch["input_ids"].shape, IGNORE_INDEX, dtype=torch.long, device=batch["input_ids"].device)
    real = batch["masked_labels"] != IGNORE_INDEX
    labels.view(-1)[batch["masked_positions"][real]] = batch["masked_labels"][real]
    return labels


def masked_count(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """How many positions the batch predicts, as a tensor on the batch's device (no sync)."""
    return (batch["masked_labels"] != IGNORE_INDEX).sum()
