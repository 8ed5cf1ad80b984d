"""The data stream: which sequences each step draws, from one corpus or a mix, across epochs, resumes,
rank layouts, stretches and skipped steps."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.data.epoch_order import CorpusLayout
from pipeline.pretrain.batches.stretch_data import RankKeys
from pipeline.pretrain.plan.masking import Masker
from pipeline.pretrain.plan.stream import DataStream, shares_of


def keys(stream: DataStream, rank: int, start: int, end: int, skipped=()) -> list:
    return list(RankKeys(stream, rank, start, end, skipped))


def step_rows(stream: DataStream, step: int) -> list[int]:
    corpus, rows, _ = stream.step_sequences(step)
    return sorted((stream.offsets[corpus] + rows).tolist())


def test_ranks_read_disjoint_slices_that_cover_each_global_batch():
    stream = DataStream([100], BatchPlan.derive(16, 2, 4), seed=3)
    for step in range(12):
        together = np.concatenate([k.indices for r in range(4) for k in keys(stream, r, step, step + 1)])
        assert len(set(together.tolist())) == 16 and sorted(together.tolist()) == step_rows(stream, step)


def test_every_epoch_draws_each_sequence_once_even_where_a_batch_straddles_two():
    stream = DataStream([100], BatchPlan.derive(16, 16, 1), seed=1)  # 100 is no multiple of 16: nothing dropped
    _, rows, epochs = zip(*(stream.step_sequences(s) for s in range(25)), strict=True)  # 400 draws: 4 epochs
    rows, epochs = np.concatenate(rows), np.concatenate(epochs)
    for epoch in range(4):
        assert sorted(rows[epochs == epoch].tolist()) == list(range(100))
    first, second = stream.order(0, 0).rows(np.arange(100)), stream.order(0, 1).rows(np.arange(100))
    assert not np.array_equal(first, second)  # each epoch its own permutation
    assert np.array_equal(DataStream([100], stream.plan, seed=1).order(0, 1).rows(np.arange(100)), second)
    assert not np.array_equal(DataStream([100], stream.plan, seed=2).order(0, 0).rows(np.arange(100)), first)


def test_two_ranks_times_two_micro_steps_see_the_micro_batches_of_one_rank_times_four():
    one = DataStream([200], BatchPlan.derive(16, 4, 1), seed=0)
    two = DataStream([200], BatchPlan.derive(16, 4, 2), seed=0)
    for step in range(5):
        assert {tuple(k.indices) for k in keys(one, 0, step, step + 1)} == \
            {tuple(k.indices) for r in range(2) for k in keys(two, r, step, step + 1)}


def test_resuming_at_step_k_continues_the_same_batches_on_every_rank():
    plan = BatchPlan.derive(32, 4, 2)
    for corpora, shares in (([300], None), ([300, 1000], shares_of([0.4, 0.6]))):
        uninterrupted = DataStream(corpora, plan, seed=5, shares=shares)
        resumed = DataStream(corpora, plan, seed=5, shares=shares)  # a new process at step 9
        for rank in range(2):
            before = keys(uninterrupted, rank, 0, 30)[9 * plan.accumulation:]
            after = keys(resumed, rank, 9, 30)
            assert all(np.array_equal(a.indices, b.indices) and np.array_equal(a.epoch, b.epoch)
                       for a, b in zip(before, after, strict=True))


def test_a_skipped_range_leaves_every_later_step_its_own_batch_on_one_and_two_ranks():
    for plan in (BatchPlan.derive(32, 8, 1), BatchPlan.derive(32, 8, 2)):
        stream = DataStream([300, 1000], plan, seed=4, shares=shares_of([0.3, 0.7]))
        for rank in range(plan.world_size):
            full = keys(stream, rank, 0, 40)
            skipping = keys(stream, rank, 0, 40, skipped=(range(10, 15), range(20, 21)))
            kept = [k for s in range(40) if not (10 <= s < 15 or s == 20)
                    for k in full[s * plan.accumulation:(s + 1) * plan.accumulation]]
            assert len(skipping) == 34 * plan.accumulation
            assert all(np.array_equal(a.indices, b.indices) for a, b in zip(kept, skipping, strict=True))
            resumed = keys(stream, rank, 12, 40, skipped=(range(10, 15), range(20, 21)))  # from inside the range
            assert all(np.array_equal(a.indices, b.indices) for a, b in zip(skipping[10 * plan.accumulation:],
                                                                             resumed, strict=True))


@pytest.mark.parametrize("weights,sizes", [([0.3, 0.7], [700, 2500]), ([5, 3, 2], [90, 4000, 333])],
                         ids=["0.3-0.7", "5-3-2"])
def test_over_10000_sequences_the_realised_mix_is_within_one_point_of_the_weights(weights, sizes):
    stream = DataStream(sizes, BatchPlan.derive(40, 8, 1), seed=3, shares=shares_of(weights))
    shares = np.array(weights) / sum(weights)
    counts = stream.drawn(250)  # 250 steps × 40 = 10,000 sequences
    corpus = np.concatenate([stream.step_sequences(s)[0] for s in range(250)])
    assert np.bincount(corpus).tolist() == counts.tolist() == [round(s * 10_000) for s in shares]  # as written
    # Stronger, and what makes it hold at any length: after every step each corpus is within one of its share.
    for step in (1, 7, 33, 250):
        assert np.abs(stream.drawn(step) - shares * step * 40).max() < 1


def test_each_step_mixes_the_corpora_across_its_micro_batches():
    stream = DataStream([500, 500], BatchPlan.derive(64, 8, 2), seed=0)
    mixed = [len(set(np.searchsorted(stream.offsets, stream.micro_batch(3, k).indices, side="right")))
             for k in range(8)]
    assert sum(n == 2 for n in mixed) >= 6  # not one corpus per micro batch (or per rank)


def test_a_corpus_that_runs_out_starts_a_new_epoch_with_new_masks():
    small, large = 12, 1000
    stream = DataStream([small, large], BatchPlan.derive(16, 16, 1), seed=0, shares=shares_of([0.25, 0.75]))
    draws = [(r, e) for s in range(12) for c, r, e in zip(*stream.step_sequences(s), strict=True) if c == 0]
    assert len(draws) == 48  # 4 of every 16 sequences: 4 epochs of the small corpus, 0.144 of the large one
    for epoch in range(4):
        assert sorted(r for r, e in draws if e == epoch) == list(range(small))  # each sequence once per epoch
    assert stream.drawn(12).tolist() == [48, 144]
    masker = Masker(400, 4, (0, 1, 2, 3, 4), seed=0)
    ids = np.full((1, 64), 10)
    first, second = (masker(ids, np.array([e]), np.array([5]))[1] for e in (0, 1))
    assert not np.array_equal(first, second)  # the same sequence, its next epoch: another mask
    # Rows are numbered over the corpora end to end, so corpus 0's row 5 and corpus 1's never share a mask key.
    mask_keys = masker.keys(np.array([e for _, e in draws] + [0] * 4),
                            np.array([r for r, _ in draws] + [small + 5] * 4))
    assert len(set(mask_keys[:48].tolist())) == 48 and mask_keys[48] not in set(mask_keys[:48].tolist())


def test_a_new_stretch_continues_each_corpus_where_the_last_one_left_it():
    """A change of mix or batch (a phase, a resume into an edited mix) repeats and skips nothing."""
    corpora = [CorpusLayout.of_size(90, key=0), CorpusLayout.of_size(70, key=1)]
    first = DataStream(corpora, BatchPlan.derive(16, 8, 1), seed=2, shares=shares_of([0.5, 0.5]), start=0)
    after = first.drawn(7)  # 112 draws, 56 each
    second = DataStream(corpora, BatchPlan.derive(24, 8, 1), seed=2, shares=(Fraction(1, 6), Fraction(5, 6)),
                        first_draws=after, start=7)
    seen = [[] for _ in corpora]
    for stream, steps in ((first, range(0, 7)), (second, range(7, 17))):
        for step in steps:
            for c, r, e in zip(*stream.step_sequences(step), strict=True):
                seen[c].append((int(e), int(r)))
    for c, size in enumerate((90, 70)):
        drawn = seen[c]
        assert len(drawn) == len(set(drawn)) == second.drawn(17)[c]  # nothing twice
        whole = [(e, r) for e, r in drawn if e < max(e for e, _ in drawn)]
        assert sorted(whole) == [(e, r) for e in range(len(whole) // size) for r in range(size)]  # nothing skipped


def test_the_order_at_200_million_sequences_holds_no_per_sequence_state():
    import tracemalloc

    plan = BatchPlan.derive(8192, 32, 8)
    tracemalloc.start()
    late = DataStream([200_000_000], plan, seed=0).micro_batch(20_000, 5)  # epoch 0, near its end
    next_epoch = DataStream([200_000_000], plan, seed=0).micro_batch(30_000, 5)
    mixed = DataStream([150_000_000, 50_000_000], plan, seed=0, shares=shares_of([0.7, 0.3])).micro_batch(40_000, 5)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 4 << 20  # an int64 permutation would be 1.6 GB here
    assert len(set(late.indices.tolist())) == 32 and late.indices.max() < 200_000_000
    assert set(next_epoch.epoch.tolist()) == {1} and len(mixed.indices) == 32
