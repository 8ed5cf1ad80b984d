"""What an operator does to a long run, on 2 ranks and across resumes: roll back past a spike and skip its
batches, trace a step to its documents, change the mix at a resume, and resume in a recorded block order."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import make_documents, tiny_pretrain_config, write_jsonl
from test_pretrain_distributed import DEEPSPEED, launch, write_config

from pipeline.common.run_layout import PretrainLayout
from pipeline.data.shard_reader import ShardedDataset
from pipeline.pretrain.checkpoint_record import read_record
from pipeline.pretrain.checkpoints import newest_complete

STEPS = 12


def make_shards(root: Path, tokenizer: Path, name: str, seed: int) -> Path:
    """200 documents in shards of 20 sequences: enough shards for a block size to change the order."""
    from pipeline.data.shard_options import ShardOptions
    from pipeline.data.shard_stage import run_shard_stage

    corpus = write_jsonl(root / f"{name}.jsonl", make_documents(200, seed=seed))
    run_shard_stage(ShardOptions(inputs=(str(corpus),), tokenizer=str(tokenizer), out=str(root / name), workers=1,
                                 shard_size=20, val_fraction=0.1, seq_len=64, quiet=True))
    return root / name


@pytest.fixture(scope="module")
def operations(tmp_path_factory, bpe_tokenizer_dir) -> Path:
    root = tmp_path_factory.mktemp("long_runs")
    news, wiki = (make_shards(root, bpe_tokenizer_dir, name, seed) for name, seed in (("news", 5), ("wiki", 6)))
    sections = {"data": {"num_workers": 1, "cache_dir": str(root / "cache")},
                "train": {"max_steps": STEPS, "export": False}, "checkpoint": {"every": 2, "keep_last": 20}}
    single = write_config(root / "config.json", tiny_pretrain_config(news, bpe_tokenizer_dir, root / "x", **sections))
    mixed = tiny_pretrain_config(news, bpe_tokenizer_dir, root / "x", **sections)
    mixed["data"]["shards"] = [{"path": str(news), "weight": 1}, {"path": str(wiki), "weight": 1}]
    launch(DEEPSPEED, "tests/dist/long_run_operations.py", single, write_config(root / "mixed.json", mixed), root,
           timeout=900)
    return root


def seen(root: Path, name: str) -> tuple[list[dict[int, list[str]]], list[dict[int, float]]]:
    runs = [json.loads((root / f"{name}-rank{r}.json").read_text()) for r in range(2)]
    return ([{int(k): v for k, v in run["seen"].items()} for run in runs],
            [{int(k): v for k, v in run["lr"].items()} for run in runs])


def traced(run: Path, step: int) -> list[str]:
    """The trace's sequences of `step`, as digests of their tokens (what the harness notes of a trained batch)."""
    from pipeline.commands.trace import trace_step

    sequences, _ = trace_step(run, step)
    folders = {c.name: c.path for c in read_record(newest_complete(PretrainLayout(run).checkpoints)).corpora}
    digests = []
    for s in sequences:
        ids = ShardedDataset(folders[s["corpus"]], "train")[s["row"]]["input_ids"]
        digests.append(hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16])
    return digests


@pytest.mark.slow
def test_a_skipped_range_rolls_back_and_every_later_step_keeps_its_batch_and_lr(operations):
    (full, _), (rolled, _) = seen(operations, "full"), seen(operations, "rolled")
    full_lr, rolled_lr = seen(operations, "full")[1], seen(operations, "rolled")[1]
    for rank in range(2):
        assert sorted(full[rank]) == list(range(1, STEPS + 1))
        # Rolled back to step 4, the last checkpoint before 6: step 5 again, then 8 onwards; 6 and 7 left out.
        assert sorted(rolled[rank]) == [5, *range(8, STEPS + 1)]
        assert all(rolled[rank][s] == full[rank][s] for s in rolled[rank])  # every later step: its own batch
        assert all(rolled_lr[rank][s] == pytest.approx(full_lr[rank][s]) for s in rolled_lr[rank])  # and its LR
    checkpoints = PretrainLayout(operations / "rolled").checkpoints
    assert sorted(p.name for p in checkpoints.glob("rolled-back-*")) == [
        f"rolled-back-step_{s:08d}" for s in range(6, STEPS + 1, 2)]  # kept for a look, never resumed from
    record = read_record(newest_complete(checkpoints))
    assert record.step == STEPS and record.skipped == ((6, 7),)
    events = [json.loads(line) for line in PretrainLayout(operations / "rolled").metrics.read_text().splitlines()]
    assert any(e.get("skipped_steps") == "6:7" for e in events)


@pytest.mark.slow
def test_the_trace_of_a_step_is_what_the_loader_gave_both_ranks(operations):
    for name in ("full", "mixed"):
        loaders, _ = seen(operations, name)
        for step in (1, 7, STEPS):
            assert sorted(traced(operations / name, step)) == sorted(loaders[0][step] + loaders[1][step]), (name, step)


@pytest.mark.slow
def test_the_trace_names_the_documents_that_hold_each_sequence(operations):
    from pipeline.commands.trace import trace_step

    sequences, notes = trace_step(operations / "mixed", 7)
    assert not notes and len(sequences) == 16
    for sequence in sequences:
        assert sequence["documents"], sequence
        texts = []
        for document in sequence["documents"]:
            lines = (operations / Path(document["file"]).name).read_text().splitlines()
            texts.append(json.loads(lines[document["line"] - 1])["text"])
        # Every word of the sequence comes from the documents named; a row can start and end mid-word.
        words = sequence["text"].replace("<s>", " ").replace("</s>", " ").split()[1:-1]
        assert set(words) <= set(" ".join(texts).split()), (sequence["text"], texts)


@pytest.mark.slow
def test_a_mix_changed_at_a_resume_repeats_and_skips_nothing(operations):
    from pipeline.pretrain.preflight import recorded_plan

    record = read_record(newest_complete(PretrainLayout(operations / "mixed").checkpoints))
    first, second = record.stretches
    assert (first.start, first.end, [str(s) for s in first.shares]) == (0, 6, ["1/2", "1/2"])
    assert (second.start, second.end, [str(s) for s in second.shares]) == (6, STEPS, ["1/4", "3/4"])
    assert second.first_draws == (48, 48)  # 6 steps × 16, half each: where the 1:1 mix left each corpus
    plan = recorded_plan(operations / "mixed")
    drawn: dict[int, list[tuple[int, int]]] = {}
    for step in range(STEPS):
        stretch = plan.stretch_at(step)
        for c, row, epoch in zip(*stretch.stream(plan.config.train.seed).step_sequences(step), strict=True):
            drawn.setdefault(stretch.corpora[c].key, []).append((int(epoch), int(row)))
    for key, draws in drawn.items():
        assert len(draws) == len(set(draws)), key  # no sequence twice within an epoch
        size = next(c.num_sequences for c in record.corpora if c.key == key)
        for epoch in {e for e, _ in draws} - {max(e for e, _ in draws)}:  # each finished epoch: all of it
            assert sorted(r for e, r in draws if e == epoch) == list(range(size))


@pytest.mark.slow
def test_a_resume_with_an_edited_peak_lr_trains_at_it_not_at_the_checkpoints(operations):
    from pipeline.pretrain.preflight import recorded_plan

    schedule = recorded_plan(operations / "mixed").schedule
    _, lrs = seen(operations, "mixed")
    for rank in range(2):
        assert lrs[rank][3] == pytest.approx(2e-3)  # the first session's peak (its warmup is 2 steps)
        assert all(lrs[rank][s] == pytest.approx(1e-3 * schedule.multiplier(s - 1)) for s in range(7, STEPS + 1))


@pytest.mark.slow
def test_a_checkpoint_from_other_block_defaults_resumes_in_its_recorded_order(operations):
    from pipeline.pretrain.preflight import recorded_plan
    from pipeline.pretrain.stream import DataStream

    record = read_record(newest_complete(PretrainLayout(operations / "mixed").checkpoints))
    assert {c.shards_per_block for c in record.corpora} == {3}  # the defaults the run started under, kept
    plan = recorded_plan(operations / "mixed")
    stretch = plan.stretch_at(8)
    default = [c.__class__(**{**c.__dict__, "shards_per_block": 64}) for c in stretch.corpora]
    today = DataStream(default, stretch.stream(0).plan, plan.config.train.seed, shares=stretch.shares,
                       first_draws=stretch.first_draws, start=stretch.start)
    recorded = stretch.stream(plan.config.train.seed)
    assert not np.array_equal(today.step_sequences(8)[1], recorded.step_sequences(8)[1])
    loaders, _ = seen(operations, "mixed")
    assert sorted(traced(operations / "mixed", 9)) == sorted(loaders[0][9] + loaders[1][9])  # the recorded one
