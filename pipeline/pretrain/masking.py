"""Dynamic MLM masking, vectorised over a batch and reproducible from (seed, epoch, sequence index).

Written by hand rather than using transformers' `DataCollatorForLanguageModeling` for two reasons:
- speed: HF builds the special-token mask with a Python loop per sequence; here one table lookup
  covers the batch (see benchmarks/collator_throughput.py);
- exact resumption: HF draws from the process's global RNG, so a mask depends on everything drawn
  before it. Here each token's random numbers are a hash (splitmix64) of (seed, stream, epoch,
  sequence index, position): a sequence gets the same mask whichever rank, worker or resumed run
  serves it, and a new one every epoch. `static` mode drops the epoch from the key (RoBERTa's
  ablation: one mask per sequence for the whole run).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IGNORE_INDEX = -100
"""Label of positions that are not predicted (the value PyTorch's cross-entropy ignores)."""

TRAIN_STREAM, EVAL_STREAM = 1, 2
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a bijective 64-bit mix whose outputs pass BigCrush as a counter RNG."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _uniform(bits: np.ndarray) -> np.ndarray:
    """Top 53 bits → float64 in [0, 1)."""
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class MaskingSpec:
    vocab_size: int
    mask_id: int
    special_ids: tuple[int, ...]
    probability: float = 0.15
    mask_token_fraction: float = 0.8
    random_token_fraction: float = 0.1
    static: bool = False


class Masker:
    """Chooses and corrupts MLM positions for a batch of token rows."""

    def __init__(self, spec: MaskingSpec, seed: int):
        self.spec = spec
        self.seed = seed
        self._is_special = np.zeros(max(spec.vocab_size, max(spec.special_ids, default=0) + 1), dtype=bool)
        self._is_special[list(spec.special_ids)] = True
        # Random replacements are ordinary tokens only: a random <s> or <pad> would teach nothing.
        self._ordinary_ids = np.flatnonzero(~self._is_special[: spec.vocab_size])

    def keys(self, epoch: int | np.ndarray, indices: np.ndarray, stream: int = TRAIN_STREAM) -> np.ndarray:
        """One 64-bit key per sequence from (seed, stream, epoch, index); `epoch` is one or one per sequence."""
        epoch = 0 if self.spec.static else epoch  # a mix of corpora has an epoch per sequence (mixture.py)
        base = splitmix64(np.array([self.seed * 4 + stream], dtype=np.uint64)
                          + (np.atleast_1d(np.asarray(epoch, dtype=np.uint64)) + np.uint64(1)) * _GOLDEN)
        return splitmix64(base ^ splitmix64(indices.astype(np.uint64) + _GOLDEN))

    def __call__(self, input_ids: np.ndarray, epoch: int | np.ndarray, indices: np.ndarray,
                 stream: int = TRAIN_STREAM) -> tuple[np.ndarray, np.ndarray]:
        """Return (corrupted input ids, labels) as int64; labels are IGNORE_INDEX where nothing is predicted."""
        spec = self.spec
        ids = input_ids.astype(np.int64)
        rows, length = ids.shape
        keys = self.keys(epoch, np.asarray(indices), stream)
        positions = np.arange(length, dtype=np.uint64) * _GOLDEN
        bits = splitmix64(keys[:, None] ^ positions[None, :])
        chosen = (_uniform(bits) < spec.probability) & ~self._is_special[ids]
        labels = np.where(chosen, ids, IGNORE_INDEX)

        # A second, independent draw for the chosen positions only: which corruption, which token.
        rows_i, cols_i = np.nonzero(chosen)
        second = splitmix64(bits[rows_i, cols_i] ^ _M2)
        kind = _uniform(second)
        corrupted = ids.copy()
        to_mask = kind < spec.mask_token_fraction
        to_random = (~to_mask) & (kind < spec.mask_token_fraction + spec.random_token_fraction)
        corrupted[rows_i[to_mask], cols_i[to_mask]] = spec.mask_id
        random_pick = splitmix64(second[to_random]) % np.uint64(len(self._ordinary_ids))
        corrupted[rows_i[to_random], cols_i[to_random]] = self._ordinary_ids[random_pick.astype(np.int64)]
        return corrupted, labels
