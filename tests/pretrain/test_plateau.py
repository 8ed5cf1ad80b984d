"""The unigram plateau's level: entropy of token counts, over a shard folder's validation split."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.data.shards.reader import ShardedDataset
from pipeline.pretrain.report.plateau import (
    copy_floor_nats,
    plateau_level,
    token_counts,
    unigram_entropy_nats,
    validation_unigram_entropy,
)


def test_two_equally_frequent_tokens_have_an_entropy_of_ln_2():
    assert unigram_entropy_nats(np.array([2, 2])) == pytest.approx(math.log(2))


def test_unused_ids_do_not_count_and_one_token_type_has_no_entropy():
    expected = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert unigram_entropy_nats(np.array([0, 3, 0, 1])) == pytest.approx(expected)
    assert unigram_entropy_nats(np.array([0, 7])) == 0.0


def test_counts_that_are_empty_or_negative_are_refused():
    with pytest.raises(ValueError, match="zero"):
        unigram_entropy_nats(np.zeros(3))
    with pytest.raises(ValueError, match="non-negative"):
        unigram_entropy_nats(np.array([1, -1]))


def test_the_validation_entropy_counts_every_ordinary_validation_token_and_no_special_one(roberta_shards,
                                                                                          bpe_tokenizer_dir):
    from pipeline.data.tokenizer import load_tokenizer

    special = load_tokenizer(bpe_tokenizer_dir).all_special_ids
    val = ShardedDataset(roberta_shards, "val")
    ids = np.concatenate([val[i]["input_ids"] for i in range(len(val))]).astype(np.int64)
    ordinary = ids[~np.isin(ids, special)]
    assert np.isin(ids, special).any()  # the case has special tokens to exclude
    counts = token_counts(roberta_shards, special)
    assert counts[special].sum() == 0 and counts.sum() == len(ordinary)
    _, expected = np.unique(ordinary, return_counts=True)
    assert validation_unigram_entropy(roberta_shards, special) == pytest.approx(unigram_entropy_nats(expected))
    # Counting the specials too would give another level: the exclusion is what is measured.
    assert unigram_entropy_nats(np.bincount(ids)) != pytest.approx(unigram_entropy_nats(expected))


def test_the_plateau_level_leaves_out_the_ids_the_masker_never_chooses(roberta_shards, bpe_tokenizer_dir):
    from pipeline.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(bpe_tokenizer_dir)
    expected = validation_unigram_entropy(roberta_shards, tokenizer.all_special_ids)
    assert plateau_level(roberta_shards, bpe_tokenizer_dir) == pytest.approx(expected)  # a folder
    assert plateau_level(roberta_shards, tokenizer) == pytest.approx(expected)  # or a loaded tokenizer


def test_copying_the_visible_token_lowers_the_floor_only_when_some_targets_stay_visible():
    counts = np.array([5, 3, 2, 0])
    h = unigram_entropy_nats(counts)
    assert copy_floor_nats(counts, 4, mask_token_fraction=1.0, random_token_fraction=0.0) == pytest.approx(h)
    # Every target kept: the visible token is the answer, nothing is left to predict.
    assert copy_floor_nats(counts, 4, mask_token_fraction=0.0, random_token_fraction=0.0) == pytest.approx(0.0)
    # 80/10/10 with 2 ordinary ids of equal frequency: given a visible x, P(y = x | x) = (0.5 + 0.25) / 1 = 0.75.
    floor = copy_floor_nats(np.array([1, 1]), 2)
    visible = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert floor == pytest.approx(0.8 * math.log(2) + 0.2 * visible)
