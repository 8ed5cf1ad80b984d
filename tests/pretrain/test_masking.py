"""Dynamic masking: RoBERTa's proportions, never a special token, reproducible from (seed, epoch, index)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.pretrain.masking import IGNORE_INDEX, Masker, MaskingSpec

SPECIAL = (0, 1, 2, 3, 4)  # <s> <pad> </s> <unk> <mask>
MASK_ID, VOCAB = 4, 1000


def make_masker(seed: int = 0, **spec) -> Masker:
    return Masker(MaskingSpec(VOCAB, MASK_ID, SPECIAL, **spec), seed)


def random_rows(rows: int, length: int, seed: int = 1) -> np.ndarray:
    """Ordinary tokens framed by <s> … </s>, with some padding at the end of every row."""
    ids = np.random.default_rng(seed).integers(5, VOCAB, size=(rows, length))
    ids[:, 0], ids[:, -8] = 0, 2
    ids[:, -7:] = 1
    return ids


def test_proportions_over_a_million_tokens_match_15_80_10_10():
    ids = random_rows(2048, 512)  # 1,048,576 tokens
    ordinary = ids >= 5
    corrupted, labels = make_masker()(ids, epoch=0, indices=np.arange(len(ids)))
    chosen = labels != IGNORE_INDEX
    n = chosen.sum()
    # Binomial standard errors: 15% of ~1.03M is ±0.035 points; 80/10/10 of ~155k is ±0.1 points.
    assert abs(n / ordinary.sum() - 0.15) < 0.002
    assert abs((corrupted[chosen] == MASK_ID).mean() - 0.80) < 0.005
    kept = (corrupted[chosen] == ids[chosen]).mean()
    randomised = 1 - (corrupted[chosen] == MASK_ID).mean() - kept
    assert abs(kept - 0.10) < 0.005 + 0.001  # a random token equals the original 1 time in 995
    assert abs(randomised - 0.10) < 0.005
    assert np.array_equal(labels[chosen], ids[chosen])
    assert np.array_equal(corrupted[~chosen], ids[~chosen])


def test_special_tokens_are_never_chosen_or_drawn_as_replacements():
    ids = random_rows(512, 256)
    corrupted, labels = make_masker(probability=0.5)(ids, epoch=3, indices=np.arange(len(ids)))
    assert (labels[ids < 5] == IGNORE_INDEX).all()
    randomised = (labels != IGNORE_INDEX) & (corrupted != MASK_ID) & (corrupted != ids)
    assert randomised.sum() > 1000 and (corrupted[randomised] >= 5).all()


def test_a_sequence_gets_the_same_mask_whichever_batch_serves_it():
    ids = random_rows(64, 128)
    masker = make_masker(seed=7)
    whole = masker(ids, epoch=2, indices=np.arange(100, 164))
    # The same sequences split into other batches, in another order (another rank or a resumed run).
    order = np.random.default_rng(0).permutation(64)
    parts = [masker(ids[order[i:i + 16]], epoch=2, indices=100 + order[i:i + 16]) for i in range(0, 64, 16)]
    for (corrupted, labels), start in zip(parts, range(0, 64, 16), strict=True):
        rows = order[start:start + 16]
        assert np.array_equal(corrupted, whole[0][rows]) and np.array_equal(labels, whole[1][rows])


def test_dynamic_masks_differ_across_epochs_and_static_ones_do_not():
    ids = random_rows(32, 128)
    indices = np.arange(32)
    dynamic = make_masker()
    assert not np.array_equal(dynamic(ids, 0, indices)[1], dynamic(ids, 1, indices)[1])
    static = make_masker(static=True)
    assert np.array_equal(static(ids, 0, indices)[1], static(ids, 5, indices)[1])


@pytest.mark.parametrize("probability", [0.15, 0.30])
def test_probability_is_configurable(probability):
    ids = random_rows(256, 512)
    _, labels = make_masker(probability=probability)(ids, 0, np.arange(256))
    assert abs((labels != IGNORE_INDEX).sum() / (ids >= 5).sum() - probability) < 0.005


def test_another_seed_gives_other_masks():
    ids = random_rows(8, 128)
    a = make_masker(seed=1)(ids, 0, np.arange(8))[1]
    b = make_masker(seed=2)(ids, 0, np.arange(8))[1]
    assert not np.array_equal(a, b)
