"""Masked slots: a micro batch's masked positions in a number of slots fixed by its shape and the masking config,
listing every masked position the masker chose (never a truncated mask), with leftover slots that predict nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_masking import UNITS, make_masker, random_rows

from pipeline.pretrain.batches.masked_slots import (
    MARGIN_SIGMAS,
    SLOT_MULTIPLE,
    dense_labels,
    masked_count,
    masked_slots,
    slot_bound,
    slot_count,
)
from pipeline.pretrain.batches.stretch_data import MaskedBatches
from pipeline.pretrain.config import MaskingConfig
from pipeline.pretrain.plan.masking import IGNORE_INDEX
from pipeline.pretrain.plan.stream import MicroBatchKey


class Rows:
    """An in-memory stand-in for a token cache: full rows of ordinary tokens framed by <s> … </s>."""

    def __init__(self, rows: int, length: int):
        self.fields = {"input_ids": random_rows(rows, length).astype(np.uint16)}

    def __len__(self) -> int:
        return len(self.fields["input_ids"])


@pytest.mark.parametrize("unit", UNITS)
def test_every_micro_batch_of_one_shape_has_the_same_slots(unit):
    batches = MaskedBatches(Rows(64, 128), make_masker(unit=unit), with_segments=False)
    first, second = (batches[MicroBatchKey(0, np.arange(start, start + 8))] for start in (0, 8))
    assert masked_count(first) != masked_count(second)  # different masks…
    for key in ("masked_positions", "masked_labels"):  # …in the same static shape, decided on the host
        assert first[key].shape == second[key].shape == (slot_bound(8 * 128, 0.15, MaskingConfig(unit=unit)),)
        assert first[key].dtype == torch.int64
    assert "labels" not in first  # one representation of the targets


@pytest.mark.parametrize("unit", UNITS)
def test_the_slots_list_exactly_the_maskers_choice_so_its_statistics_are_unchanged(unit):
    masker = make_masker(unit=unit, probability=0.3)
    rows = Rows(16, 96)
    batch = MaskedBatches(rows, masker, with_segments=False)[MicroBatchKey(2, np.arange(16))]
    corrupted, labels = masker(rows.fields["input_ids"].astype(np.int64), 2, np.arange(16))
    assert np.array_equal(batch["input_ids"].numpy(), corrupted)
    assert np.array_equal(dense_labels(batch).numpy(), labels)
    # Real slots first, row-major (the order the head's logits keep); the leftover ones point at position 0.
    count = int(masked_count(batch))
    assert np.array_equal(batch["masked_positions"][:count].numpy(), np.flatnonzero(labels != IGNORE_INDEX))
    assert (batch["masked_positions"][count:] == 0).all() and (batch["masked_labels"][count:] == IGNORE_INDEX).all()


def test_the_bound_is_the_mean_plus_six_sigma_rounded_up_to_whole_tiles():
    tokens, p = 32 * 512, 0.15
    bound = slot_bound(tokens, p, MaskingConfig())
    assert bound % SLOT_MULTIPLE == 0
    assert tokens * p + MARGIN_SIGMAS * math.sqrt(tokens * p * (1 - p)) <= bound < \
        tokens * p + MARGIN_SIGMAS * math.sqrt(tokens * p * (1 - p)) + SLOT_MULTIPLE
    assert bound == 2752  # 12% above the 2458 masked on average
    # Whole words and spans come in clumps, so their count varies more: more slots at the same rate.
    assert bound < slot_bound(tokens, p, MaskingConfig(unit="word")) < slot_bound(tokens, p, MaskingConfig(unit="span"))
    assert slot_bound(tokens, 0.3, MaskingConfig()) > bound
    assert slot_bound(16, 0.5, MaskingConfig()) == SLOT_MULTIPLE  # never more than every position, rounded up


@pytest.mark.parametrize("unit", UNITS)
def test_no_micro_batch_of_many_draws_comes_near_its_bound(unit):
    """The bound has six standard deviations of room: 200 batches stay well inside it."""
    masker = make_masker(unit=unit)
    bound = slot_bound(8 * 512, masker.probability, masker.masking)
    most = max(int((masker(random_rows(8, 512, seed=b), 0, np.arange(8 * b, 8 * b + 8))[1] != IGNORE_INDEX).sum())
               for b in range(200))
    assert most < bound


def test_a_micro_batch_masking_more_than_the_bound_gets_the_next_bucket_not_a_truncation():
    ids = random_rows(4, 64)
    labels = np.where(ids >= 5, ids, IGNORE_INDEX)  # every ordinary token masked: far above any bound
    bound = slot_bound(ids.size, 0.15, MaskingConfig())
    masked = int((labels != IGNORE_INDEX).sum())
    assert bound < masked
    slots = masked_slots(labels, bound)
    assert len(slots["masked_positions"]) == slot_count(masked, bound, ids.size) == 2 * bound
    assert np.array_equal(dense_labels({"input_ids": torch.from_numpy(ids), **slots}).numpy(), labels)


def test_the_buckets_double_the_bound_and_stop_at_every_position():
    assert [slot_count(n, 128, 1000) for n in (0, 128, 129, 256, 257, 700, 1000)] == \
        [128, 128, 256, 256, 512, 1024, 1024]
    assert slot_count(1000, 128, 1000) >= 1000


def test_a_hand_made_batch_gets_its_masked_count_rounded_up_to_whole_tiles():
    labels = torch.full((2, 40), IGNORE_INDEX)
    labels[0, 3], labels[1, 39] = 7, 9
    slots = masked_slots(labels)
    assert slots["masked_positions"].tolist()[:3] == [3, 79, 0]
    assert slots["masked_labels"].tolist()[:3] == [7, 9, IGNORE_INDEX] and len(slots["masked_labels"]) == 64
