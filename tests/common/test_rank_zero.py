"""A choice rank 0 makes for every rank: on one rank it is a plain call; its failure, described for the other ranks, is
bounded text that names it (the 2-rank behaviour: tests/pretrain/test_rank_zero_failure.py)."""

from __future__ import annotations

import errno
import os

import pytest

from pipeline.common.errors import PipelineError
from pipeline.common.processes.rank_zero import decided_on_rank_zero, describe
from pipeline.common.processes.topology import Topology

ALONE = Topology(0, 0, 1, False)


def test_on_one_rank_the_decision_is_a_plain_call_and_its_error_is_raised_as_it_is():
    assert decided_on_rank_zero(lambda: 41 + 1, "adding", ALONE) == 42
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "runs/x/ledger.jsonl")

    def fail():
        raise full

    with pytest.raises(OSError) as raised:
        decided_on_rank_zero(fail, "planning", ALONE)
    assert raised.value is full


def test_a_failure_is_described_in_bounded_text_naming_it():
    assert describe(PipelineError("checkpoint step_4: complete.json is damaged")) == (
        "checkpoint step_4: complete.json is damaged")  # written for the user already
    assert describe(OSError(errno.EIO, os.strerror(errno.EIO), "ckpts")) == (
        "OSError: [Errno 5] Input/output error: 'ckpts'")
    assert describe(KeyError("min_trust")) == "KeyError: 'min_trust'"
    long = describe(ValueError("x" * 10_000))
    assert long.startswith("ValueError: xxx") and long.endswith(" …") and len(long) < 2100
