"""Masking: RoBERTa's proportions, whole words and SpanBERT spans, never a special token, reproducible from
(seed, epoch, index) whatever the unit."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.pretrain.config import MaskingConfig
from pipeline.pretrain.plan.masking import IGNORE_INDEX, Masker, mask_statistics
from pipeline.pretrain.span_lengths import span_length_distribution

SPECIAL = (0, 1, 2, 3, 4)  # <s> <pad> </s> <unk> <mask>
MASK_ID, VOCAB = 4, 1000
# A vocabulary where 60% of the entries begin a word: words of 1.7 tokens on average.
WORD_STARTS = np.random.default_rng(5).random(VOCAB) < 0.6
UNITS = ("token", "word", "span")


def make_masker(seed: int = 0, **spec) -> Masker:
    return Masker(VOCAB, MASK_ID, SPECIAL, seed, WORD_STARTS, masking=MaskingConfig(**spec))


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


@pytest.mark.parametrize("unit", UNITS)
def test_a_sequence_gets_the_same_mask_whichever_batch_serves_it(unit):
    ids = random_rows(64, 128)
    masker = make_masker(seed=7, unit=unit)
    whole = masker(ids, epoch=2, indices=np.arange(100, 164))
    # The same sequences split into other batches, in another order (another rank or a resumed run).
    order = np.random.default_rng(0).permutation(64)
    parts = [masker(ids[order[i:i + 16]], epoch=2, indices=100 + order[i:i + 16]) for i in range(0, 64, 16)]
    for (corrupted, labels), start in zip(parts, range(0, 64, 16), strict=True):
        rows = order[start:start + 16]
        assert np.array_equal(corrupted, whole[0][rows]) and np.array_equal(labels, whole[1][rows])


@pytest.mark.parametrize("unit", UNITS)
def test_dynamic_masks_differ_across_epochs_and_static_ones_do_not(unit):
    ids = random_rows(32, 128)
    indices = np.arange(32)
    dynamic = make_masker(unit=unit)
    assert not np.array_equal(dynamic(ids, 0, indices)[1], dynamic(ids, 1, indices)[1])
    static = make_masker(mode="static", unit=unit)
    assert np.array_equal(static(ids, 0, indices)[1], static(ids, 5, indices)[1])


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("probability", [0.15, 0.30])
def test_probability_is_configurable(probability, unit):
    ids = random_rows(256, 512)
    _, labels = make_masker(probability=probability, unit=unit)(ids, 0, np.arange(256))
    # Words and spans come in clumps, so their fraction varies more from batch to batch.
    assert abs((labels != IGNORE_INDEX).sum() / (ids >= 5).sum() - probability) < (0.005 if unit == "token" else 0.01)


def test_another_seed_gives_other_masks():
    ids = random_rows(8, 128)
    a = make_masker(seed=1)(ids, 0, np.arange(8))[1]
    b = make_masker(seed=2)(ids, 0, np.arange(8))[1]
    assert not np.array_equal(a, b)


def test_whole_word_masking_over_a_million_tokens_masks_15_percent_in_whole_words_80_10_10_per_token():
    ids = random_rows(2048, 512)
    masker = make_masker(unit="word")
    corrupted, labels = masker(ids, epoch=0, indices=np.arange(len(ids)))
    stats = mask_statistics(masker, ids, labels)
    assert abs(stats.masked_fraction - 0.15) < 0.003
    assert stats.whole_word_fraction == 1.0
    chosen = labels != IGNORE_INDEX
    assert abs((corrupted[chosen] == MASK_ID).mean() - 0.80) < 0.005
    # Per token, not per word: a chosen word of several tokens has a mix of [MASK] and others.
    starts = masker.word_starts(ids)
    mixed = chosen & ~starts & (corrupted == MASK_ID) & (np.roll(corrupted, 1, axis=1) != MASK_ID)
    assert mixed.sum() > 1000
    # Token masking, for contrast, splits about half the words it touches.
    token_masker = make_masker(unit="token")
    token_stats = mask_statistics(token_masker, ids, token_masker(ids, 0, np.arange(len(ids)))[1])
    assert token_stats.whole_word_fraction < 0.7


def test_span_masking_over_a_million_tokens_follows_spanbert():
    ids = random_rows(2048, 512)
    masker = make_masker(unit="span")
    corrupted, labels = masker(ids, epoch=0, indices=np.arange(len(ids)))
    stats = mask_statistics(masker, ids, labels)
    assert abs(stats.masked_fraction - 0.15) < 0.005
    assert stats.whole_word_fraction == 1.0
    # Realised span lengths in words against geometric(0.2) truncated at 10 (mean 3.8): ~90k spans.
    target = span_length_distribution(0.2, 10)
    assert len(stats.run_lengths) == 11  # nothing longer than 10 words
    realised = stats.run_lengths[1:] / stats.run_lengths.sum()
    assert np.abs(realised - target).max() < 0.005
    assert abs(realised @ np.arange(1, 11) - 3.8) < 0.05
    # 80/10/10 once per span: within a run of chosen tokens, all are [MASK] or none is.
    chosen = labels != IGNORE_INDEX
    is_mask = corrupted == MASK_ID
    inside = chosen[:, 1:] & chosen[:, :-1]  # adjacent chosen tokens belong to one span
    assert (is_mask[:, 1:][inside] == is_mask[:, :-1][inside]).all()
    starts_of_runs = chosen & ~np.concatenate([np.zeros((len(ids), 1), bool), chosen[:, :-1]], axis=1)
    assert abs(is_mask[starts_of_runs].mean() - 0.80) < 0.01


def test_spans_start_at_word_boundaries_and_words_are_never_split():
    ids = random_rows(256, 256)
    masker = make_masker(unit="span", probability=0.3)
    _, labels = masker(ids, epoch=1, indices=np.arange(len(ids)))
    chosen = labels != IGNORE_INDEX
    starts = masker.word_starts(ids)
    run_starts = chosen & ~np.concatenate([np.zeros((len(ids), 1), bool), chosen[:, :-1]], axis=1)
    assert starts[run_starts].all()
    run_ends = chosen & ~np.concatenate([chosen[:, 1:], np.zeros((len(ids), 1), bool)], axis=1)
    after_end = np.concatenate([np.zeros((len(ids), 1), bool), run_ends[:, :-1]], axis=1)
    ordinary_after = after_end & (ids >= 5)
    assert starts[ordinary_after].all()  # a run ends where the next word begins (or at a special token)


def test_a_word_begins_after_every_special_token():
    ids = np.array([[0, 7, 8, 2, 9, 10, 2, 1]])
    table = np.zeros(VOCAB, dtype=bool)  # no entry begins a word by itself
    masker = Masker(VOCAB, MASK_ID, SPECIAL, 0, table, masking=MaskingConfig(unit="word"))
    assert masker.word_starts(ids).tolist() == [[False, True, False, False, True, False, False, False]]


def test_mask_statistics_agree_with_a_plain_count():
    ids = np.array([[0, 10, 11, 12, 13, 14, 15, 2]])
    table = np.zeros(VOCAB, dtype=bool)
    table[[12, 14]] = True  # words: [10 11] [12 13] [14 15]
    masker = Masker(VOCAB, MASK_ID, SPECIAL, 0, table, masking=MaskingConfig(unit="word"))
    labels = np.full_like(ids, IGNORE_INDEX)
    labels[0, [1, 2, 3]] = ids[0, [1, 2, 3]]  # first word whole, second word half
    stats = mask_statistics(masker, ids, labels)
    assert stats.masked_fraction == 3 / 6 and stats.whole_word_fraction == 1 / 2
    assert stats.run_lengths.tolist() == [0, 1]


def test_word_and_span_units_need_the_word_start_table():
    with pytest.raises(ValueError, match="word-start table"):
        Masker(VOCAB, MASK_ID, SPECIAL, 0, masking=MaskingConfig(unit="span"))


def test_a_span_never_runs_from_one_packed_document_into_the_next():
    # Rows of many 3-word documents, <s> a b c </s> <s> d e f </s> …, with long, dense spans:
    # without the cut most spans would cross a document boundary.
    rng = np.random.default_rng(3)
    table = np.zeros(VOCAB, dtype=bool)
    table[5:] = True  # every ordinary token is a word
    document = [0, -1, -1, -1, 2]
    ids = np.array([[t if t >= 0 else rng.integers(5, VOCAB) for t in document * 20] for _ in range(256)])
    masking = MaskingConfig(unit="span", probability=0.45, span_p=0.05, span_max_words=10)
    masker = Masker(VOCAB, MASK_ID, SPECIAL, 0, table, masking=masking)
    chosen, slot = masker._spans(masker.keys(0, np.arange(len(ids))), masker.word_starts(ids), masker._is_special[ids])
    document_of_token = np.cumsum(masker._is_special[ids], axis=1)
    rows, cols = np.nonzero(chosen)
    spans = {}
    for r, c in zip(rows, cols, strict=True):
        spans.setdefault((r, slot[r, c]), set()).add(document_of_token[r, c])
    assert len(spans) > 1000
    assert all(len(documents) == 1 for documents in spans.values())
    assert not chosen[masker._is_special[ids]].any()
