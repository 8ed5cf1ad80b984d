"""One epoch's sequence order over a shard folder, computed on demand in O(shards) memory.

An epoch's order is a permutation of the rows `[0, n)`. Holding it as an array costs 8 bytes a
sequence on every rank (1.6 GB at 200M sequences, rebuilt each epoch); here it is never stored.
Position p of the epoch maps to a row by a keyed bijection evaluated for just the positions asked
for, so a micro batch costs O(micro batch) and a resume at any step costs nothing extra.

The order is a block shuffle (MosaicML streaming's shuffle blocks, Megatron's shuffled index,
without the index): the shards are permuted, cut into blocks of `shards_per_block` consecutive
shards, and each block's sequences are permuted among themselves. An epoch then reads one block
after another, so a node needs only the shards of one or two blocks decompressed at a time (see
`token_cache.py`), and each global batch mixes sequences from `shards_per_block` places of the
corpus. A corpus of one block is permuted as a whole, as a plain global shuffle would.

The bijection on `[0, m)` is a balanced Feistel network over the smallest even number of bits
that covers m, with cycle-walking (a value ≥ m is encrypted again until it falls inside; the
domain is under 4m, so that takes under 4 rounds on average). Black & Rogaway, "Ciphers with
arbitrary finite domains", CT-RSA 2002. Its round keys come from numpy's seeded generator, so
the order is a pure function of the key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK_TOKENS = 1 << 30
"""Token slots in a shuffle block (2 GiB of uint16 ids; a node's cache holds two blocks). A global batch draws
from one block's shards, so in a corpus sorted by source its mix strays from the corpus's as a sample of the
block's shards does: at 100B tokens of 512 in 8,192-sequence shards, 256 shards a block stray about twice as
far as a global shuffle at a batch of 1,024, 8 shards ten times (benchmarks/order_quality.py,
docs/long-runs.md)."""
MIN_BLOCK_SHARDS = 8
"""At least this many shards per block, however large the shards."""
ROUNDS = 6
"""Feistel rounds; four already give a pseudorandom permutation for a pseudorandom round function (Luby-Rackoff)."""
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def splitmix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective, fast 64-bit hash whose outputs pass BigCrush as a counter RNG (numpy's
    uint64 arithmetic wraps, which is what it needs). The one copy: the order's round function here, the masks'
    draws (pretrain/plan/masking.py) and each micro batch's dropout seed use it."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


class KeyedPermutation:
    """A pseudorandom bijection of `[0, size)` fixed by `key`: `perm(positions)` → values, O(1) state."""

    def __init__(self, size: int, key: list[int]):
        self.size = int(size)
        bits = max(2, (self.size - 1).bit_length())
        self._half = np.uint64((bits + 1) // 2)
        self._mask = np.uint64((1 << int(self._half)) - 1)
        self._keys = np.random.default_rng(key).bit_generator.random_raw(ROUNDS).astype(np.uint64)

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for k in self._keys:
            left, right = right, left ^ (splitmix64(right ^ k) & self._mask)
        return (left << self._half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        x = np.asarray(positions, dtype=np.uint64)
        if self.size <= 1:
            return x.astype(np.int64)
        x = self._encrypt(x)
        outside = np.flatnonzero(x >= self.size)
        while len(outside):  # cycle-walking: the cycle through a value < size comes back below size
            x[outside] = self._encrypt(x[outside])
            outside = outside[x[outside] >= self.size]
        return x.astype(np.int64)


@dataclass(frozen=True)
class ShardLayout:
    """How a folder's rows fall into shards, and how many shards make a shuffle block."""

    sizes: tuple[int, ...]
    """Sequences of each shard, in index order; shard i holds rows sum(sizes[:i]) onwards."""
    shards_per_block: int

    @classmethod
    def of(cls, layout: ShardLayout | int) -> ShardLayout:
        """A layout as given, or a bare sequence count as one shard (one block: a plain global shuffle)."""
        return layout if isinstance(layout, ShardLayout) else cls((int(layout),), 1)

    @property
    def num_sequences(self) -> int:
        return sum(self.sizes)


def default_shards_per_block(shard_sizes: tuple[int, ...], seq_len: int) -> int:
    """Today's block for a folder: `BLOCK_TOKENS` of its largest shards, at least `MIN_BLOCK_SHARDS` of them.

    A run records the value it started with (pretrain/plan/run_plan.py), so a release that changes it leaves a
    resumed run's order alone.
    """
    longest = max(shard_sizes, default=1) * max(seq_len, 1)
    return max(MIN_BLOCK_SHARDS, BLOCK_TOKENS // longest)


class EpochOrder:
    """The row at each position of one epoch: `EpochOrder(layout, key).rows(positions)`."""

    def __init__(self, layout: ShardLayout, key: list[int]):
        self.key = list(key)
        sizes = np.asarray(layout.sizes, dtype=np.int64)
        self.num_sequences = int(sizes.sum())
        self._first_row = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        width = max(1, layout.shards_per_block)
        if len(sizes) <= width:  # one block: the shards' own order (permuting them would add nothing)
            shards = np.arange(len(sizes))
        else:
            shards = np.random.default_rng([*self.key, len(sizes)]).permutation(len(sizes))
        self._blocks = [shards[i: i + width] for i in range(0, len(shards), width)]
        self._block_start = np.concatenate([[0], np.cumsum([sizes[b].sum() for b in self._blocks])])
        self._sizes = sizes

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """The rows at `positions` (each in `[0, num_sequences)`) of this epoch."""
        positions = np.asarray(positions, dtype=np.int64)
        block = np.searchsorted(self._block_start, positions, side="right") - 1
        rows = np.empty(positions.shape, dtype=np.int64)
        for b in np.unique(block):
            mine = block == b
            shards = self._blocks[b]
            within = np.concatenate([[0], np.cumsum(self._sizes[shards])])
            local = KeyedPermutation(within[-1], [*self.key, int(b)])(positions[mine] - self._block_start[b])
            k = np.searchsorted(within, local, side="right") - 1
            rows[mine] = self._first_row[shards[k]] + local - within[k]
        return rows

    def block_of(self, position: int) -> tuple[int, int]:
        """(first position, end position) of the block that `position` falls in."""
        b = int(np.searchsorted(self._block_start, position, side="right") - 1)
        return int(self._block_start[b]), int(self._block_start[b + 1])

    def shards_before(self, position: int) -> np.ndarray:
        """The shards of the blocks wholly read before the block that `position` falls in."""
        b = int(np.searchsorted(self._block_start, position, side="right") - 1)
        return np.concatenate([np.zeros(0, np.int64), *self._blocks[:b]])


@dataclass(frozen=True)
class CorpusLayout:
    """One corpus as the order sees it; checkpoints record it, so a resume keeps the order it started with."""

    name: str
    path: str
    key: int
    """The order's key for this corpus: from its shards' checksums, so a renamed folder keeps its order."""
    shard_sizes: tuple[int, ...]
    """Sequences of each training shard, in index order."""
    shards_per_block: int
    """Shards read together as one shuffle block (epoch_order.py)."""
    seq_len: int

    @property
    def num_sequences(self) -> int:
        return sum(self.shard_sizes)

    @property
    def shard_layout(self) -> ShardLayout:
        return ShardLayout(self.shard_sizes, self.shards_per_block)

    @classmethod
    def of_size(cls, num_sequences: int, key: int = 0) -> CorpusLayout:
        """A corpus of `num_sequences` in one shard (one block: a plain shuffle), for tests and benchmarks."""
        return cls(f"corpus{key}", "", key, (int(num_sequences),), 1, 0)
