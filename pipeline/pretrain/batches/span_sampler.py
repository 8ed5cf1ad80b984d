"""Two random spans of each document of a micro batch, drawn on the host beside the masks, for the span-contrastive
term (models/architectures/span_contrast.py pools and scores them on the device).

A document is a run of equal document ids in a row: doc-packed rows' `document_ids`, or one per row for full and
doc rows (`row_documents`), padding left out. One is eligible when it holds `min_document_tokens` and its span
bounds do not cross: a span has between max(min_tokens, ⌈min_fraction · L⌉) and min(max_tokens,
⌊max_fraction · L⌋) tokens of a document of L. The micro batch has rows × `documents_per_row` document slots; when
more documents are eligible, a random subset fills them. Each of a document's two spans (views) draws its length
uniformly between the bounds and its start uniformly inside the document; the two may overlap, as Contriever's
crops do.

Every draw is a hash (splitmix64) of the masker's per-sequence key (seed, stream, epoch, index; plan/masking.py),
salted apart from the masker's own draws, and of the document's first position in its row: a sequence gets the same
spans whichever rank, worker or resumed run serves it (in static masking, the same every epoch, as its mask).
"""

from __future__ import annotations

import numpy as np

from pipeline.data.epoch_order import splitmix64
from pipeline.pretrain.config import ContrastiveConfig

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# Salts that separate the span draws from the masker's and from each other: the document, the pick among more
# documents than slots, each view, a span's length and its start.
_DOCUMENT, _PICK, _VIEW, _LENGTH, _START = (np.uint64(s) for s in (0xC0AC29B7C97C50DD, 0x3F84D5B5B5470917,
                                                                  0x452821E638D01377, 0xBE5466CF34E90C6C,
                                                                  0x9216D5D98979FB1B))
OUTSIDE = -1
"""`span_ids` of a token in no span of its view."""


def _uniform(bits: np.ndarray) -> np.ndarray:
    """Top 53 bits → float64 in [0, 1)."""
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def row_documents(rows: int, seq_len: int, lengths: np.ndarray | None = None) -> np.ndarray:
    """Per-token document ids (rows, seq_len) of rows that are one document each: 0 up to the row's length (all of
    it without `lengths`), -1 in the padding."""
    if lengths is None:
        return np.zeros((rows, seq_len), dtype=np.int64)
    return np.where(np.arange(seq_len)[None, :] < lengths[:, None], 0, -1)


class SpanSampler:
    """`sampler(keys, documents)` → `span_ids` (2, rows, seq_len) int64: in view v, a token of document slot d's
    span holds d, every other token `OUTSIDE`."""

    def __init__(self, config: ContrastiveConfig):
        self.config = config

    def documents(self, documents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat first position, length) of every document in per-token `documents` (rows, seq_len; -1 padding)."""
        new = np.ones(documents.shape, dtype=bool)
        new[:, 1:] = documents[:, 1:] != documents[:, :-1]
        run = np.cumsum(new.ravel()) - 1
        run_lengths = np.bincount(run)
        starts = np.flatnonzero((new & (documents >= 0)).ravel())
        return starts, run_lengths[run[starts]]

    def bounds(self, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The shortest and longest span, in tokens, of documents of `lengths` tokens (they cross where none fits)."""
        c = self.config
        shortest = np.maximum(c.min_tokens, np.ceil(c.min_fraction * lengths - 1e-9)).astype(np.int64)
        longest = np.minimum(c.max_tokens, np.floor(c.max_fraction * lengths + 1e-9)).astype(np.int64)
        return shortest, longest

    def __call__(self, keys: np.ndarray, documents: np.ndarray) -> np.ndarray:
        """`span_ids` of a micro batch whose rows have the masker's `keys` and per-token `documents`."""
        rows, seq_len = documents.shape
        starts, lengths = self.documents(documents)
        shortest, longest = self.bounds(lengths)
        eligible = (lengths >= self.config.min_document_tokens) & (shortest <= longest)
        starts, lengths, shortest, longest = starts[eligible], lengths[eligible], shortest[eligible], longest[eligible]
        document_keys = splitmix64(keys[starts // seq_len] ^ _DOCUMENT ^ ((starts % seq_len + 1).astype(np.uint64)
                                                                          * _GOLDEN))
        slots = rows * self.config.documents_per_row
        if len(starts) > slots:  # a random subset, kept in the rows' order
            kept = np.sort(np.argsort(splitmix64(document_keys ^ _PICK), kind="stable")[:slots])
            starts, lengths, shortest, longest, document_keys = (a[kept] for a in (starts, lengths, shortest,
                                                                                    longest, document_keys))
        span_ids = np.full((2, rows * seq_len), OUTSIDE, dtype=np.int64)
        slot = np.arange(len(starts))
        for view in range(2):
            view_keys = splitmix64(document_keys ^ (np.uint64(view + 1) * _VIEW))
            span = shortest + (_uniform(splitmix64(view_keys ^ _LENGTH)) * (longest - shortest + 1)).astype(np.int64)
            offset = (_uniform(splitmix64(view_keys ^ _START)) * (lengths - span + 1)).astype(np.int64)
            first = np.repeat(starts + offset - np.cumsum(span) + span, span)
            span_ids[view, first + np.arange(span.sum())] = np.repeat(slot, span)
        return span_ids.reshape(2, rows, seq_len)
