"""An epoch's order: a permutation of the rows, a pure function of its key, in memory that does not grow."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.data.epoch_order import EpochOrder, KeyedPermutation, ShardLayout


@pytest.mark.parametrize("size", [1, 2, 3, 5, 64, 1000, 4097, 100_003])
def test_a_keyed_permutation_is_a_bijection_of_its_range(size):
    values = KeyedPermutation(size, [7, 1])(np.arange(size))
    assert np.array_equal(np.sort(values), np.arange(size))


def test_the_key_fixes_the_permutation_and_another_key_changes_it():
    positions = np.arange(1000)
    first = KeyedPermutation(1000, [0, 3])(positions)
    assert np.array_equal(KeyedPermutation(1000, [0, 3])(positions), first)
    assert not np.array_equal(KeyedPermutation(1000, [0, 4])(positions), first)
    assert np.abs(first - positions).mean() > 200  # shuffled, not near the identity (uniform: 333)


def test_a_block_shuffle_covers_every_row_once_and_reads_one_block_of_shards_at_a_time():
    sizes = (100, 50, 100, 7, 80, 100, 3)
    order = EpochOrder(ShardLayout(sizes, shards_per_block=2), key=[3, 0])
    rows = order.rows(np.arange(sum(sizes)))
    assert np.array_equal(np.sort(rows), np.arange(sum(sizes)))
    shard_of = np.searchsorted(np.cumsum(sizes), rows, side="right")
    boundaries = np.flatnonzero(np.diff(shard_of) != 0)
    # Four blocks of at most two shards: a block's positions name rows of its own shards only.
    blocks, start = [], 0
    while start < sum(sizes):
        start, end = order.block_of(start)
        blocks.append(set(shard_of[start:end].tolist()))
        start = end
    assert all(len(b) <= 2 for b in blocks) and set().union(*blocks) == set(range(len(sizes)))
    assert len(boundaries) > 10  # shuffled within blocks: shards interleave
