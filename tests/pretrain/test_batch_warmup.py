"""Batch-size warmup: the rule for each step's global batch, its config checks, and exact resume inside it."""

from __future__ import annotations

import json

import pytest
from helpers import tiny_pretrain_config

from pipeline.common.errors import PipelineError
from pipeline.common.processes.batch_plan import batch_ramp
from pipeline.pretrain.preflight import load_pretrain_config, prepare_run


def batches(segments) -> list[int]:
    return [s.global_batch_size for s in segments for _ in range(s.start, s.end)]


def test_the_batch_rises_linearly_in_tokens_rounded_down_to_multiples_of_the_first():
    full, first, warmup, seq_len = 64, 8, 2560, 4
    per_step = batches(batch_ramp(full, first, warmup, seq_len, max_steps=100))
    assert len(per_step) == 100
    drawn = 0
    for batch in per_step:  # the rule, step by step, from the tokens drawn before the step
        expected = full if drawn >= warmup else int((first + (full - first) * drawn / warmup) // first * first)
        assert batch == expected
        assert batch % first == 0 and first <= batch <= full
        drawn += batch * seq_len
    assert per_step[0] == first and per_step[-1] == full
    assert per_step == sorted(per_step)  # it only rises
    # Full from the first step past the warmup's tokens, never before.
    full_from = per_step.index(full)
    assert sum(per_step[:full_from]) * seq_len < warmup + full * seq_len


def test_no_warmup_is_the_full_batch_throughout():
    assert batches(batch_ramp(64, 8, 0, 4, 10)) == [64] * 10


def write(tmp_path, roberta_shards, bpe_tokenizer_dir, **train):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "run", train=train)))
    return path


def test_the_ramp_is_one_phase_in_stretches_of_one_batch_each_continuing_the_folders_stream(
        tmp_path, roberta_shards, bpe_tokenizer_dir):
    plan = prepare_run(write(tmp_path, roberta_shards, bpe_tokenizer_dir, max_steps=20, global_batch_size=16,
                             batch_warmup_tokens=4000, batch_warmup_start=4))
    plain = prepare_run(write(tmp_path, roberta_shards, bpe_tokenizer_dir, max_steps=20, global_batch_size=16))
    (phase,) = plan.phases
    assert (phase.start, phase.end, phase.global_batch_size) == (0, 20, 16)  # the ramp is no phase of its own
    stretches = plan.stretches
    assert len(stretches) > 1 and stretches[0].global_batch_size == 4 and stretches[-1].global_batch_size == 16
    assert all(s.phase is phase for s in stretches)
    assert all(a.end == b.start for a, b in zip(stretches, stretches[1:], strict=False))  # each where the last ended
    # Each stretch draws on from where the last one left the folder's stream.
    assert all(b.first_draws == tuple(a.drawn(a.end)) for a, b in zip(stretches, stretches[1:], strict=False))
    # The LR counts steps, whatever the batch: the plain run's schedule at every step.
    assert [plan.schedule.multiplier(n) for n in range(21)] == [plain.schedule.multiplier(n) for n in range(21)]
    per_step = [s.global_batch_size for s in stretches for _ in range(s.start, s.end)]
    assert [plan.sequences_seen(n) for n in range(21)] == [sum(per_step[:n]) for n in range(21)]


@pytest.mark.parametrize(("train", "message"), [
    ({"batch_warmup_tokens": 100, "batch_warmup_start": 6}, r"train\.batch_warmup_start 6: .*multiple of"),
    ({"batch_warmup_tokens": 100, "batch_warmup_start": 12}, r"train\.batch_warmup_start 12 must divide"),
    ({"batch_warmup_tokens": -1}, r"train\.batch_warmup_tokens: must be ≥ 0"),
])
def test_a_ramp_that_cannot_form_whole_steps_is_a_config_error_naming_the_key(tmp_path, roberta_shards,
                                                                            bpe_tokenizer_dir, train, message):
    with pytest.raises(PipelineError, match=message):
        load_pretrain_config(write(tmp_path, roberta_shards, bpe_tokenizer_dir, global_batch_size=16, **train))


def test_two_ranks_need_a_start_that_is_a_multiple_of_micro_batch_times_two(tmp_path, roberta_shards,
                                                                            bpe_tokenizer_dir):
    config = write(tmp_path, roberta_shards, bpe_tokenizer_dir, global_batch_size=16, batch_warmup_tokens=100)
    with pytest.raises(PipelineError, match=r"set train\.batch_warmup_start=8"):
        load_pretrain_config(config, world_size=2)


@pytest.mark.slow
def test_a_run_resumed_inside_the_warmup_draws_the_same_batches_and_losses(tmp_path, roberta_shards,
                                                                          bpe_tokenizer_dir):
    """One process, two runs (tests/dist/batch_warmup_resume.py)."""
    from test_pretrain_distributed import launch, step_losses, write_config

    config = write_config(tmp_path / "config.json", tiny_pretrain_config(
        roberta_shards, bpe_tokenizer_dir, tmp_path / "unused", data={"num_workers": 0, "cache_dir": str(tmp_path)},
        train={"export": False, "max_steps": 10, "global_batch_size": 16, "batch_warmup_tokens": 2048,
               "batch_warmup_start": 4},
        checkpoint={"every": 1, "keep_last": 20}))
    launch([], "tests/dist/batch_warmup_resume.py", config, tmp_path, 3, timeout=400)
    full, resumed = ({int(k): v for k, v in json.loads((tmp_path / f"{n}-batches.json").read_text()).items()}
                     for n in ("full", "resumed"))
    sizes = [full[s]["global_batch_size"] for s in sorted(full)]
    assert sizes[0] == 4 and sizes[-1] == 16 and len(set(sizes)) > 2, sizes  # the resume is inside the ramp
    assert all(len(full[s]["micro"]) == full[s]["global_batch_size"] // 4 for s in full)  # micro batch 4, 1 rank
    assert sorted(resumed) == list(range(4, 11))
    assert all(resumed[s] == full[s] for s in resumed)
    losses, again = step_losses(tmp_path / "full"), step_losses(tmp_path / "resumed")
    assert all(again[s] == losses[s] for s in range(4, 11))
