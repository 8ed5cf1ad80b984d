"""What an operator does to a long run, on 2 ranks and across resumes: roll back past a spike and skip its
batches (and again, past the first skip), trace a step to its documents, change the mix at a resume, and resume
in a recorded block order; and, from checkpoint records alone, what a rollback refuses, remembers and keeps."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import make_documents, tiny_pretrain_config, write_jsonl
from test_pretrain_distributed import DEEPSPEED, launch, write_config

from pipeline.common.config.tree import ConfigError
from pipeline.common.errors import PipelineError
from pipeline.common.run_layout import PretrainLayout
from pipeline.data.shards.reader import ShardedDataset
from pipeline.pretrain.checkpoints.ledger import SetAsideEvent, SkipEvent, read_ledger
from pipeline.pretrain.checkpoints.record import read_record, write_record
from pipeline.pretrain.checkpoints.storage import newest_complete, tag_for

STEPS = 12


def make_shards(root: Path, tokenizer: Path, name: str, seed: int) -> Path:
    """200 documents in shards of 20 sequences: enough shards for a block size to change the order."""
    from pipeline.data.shards.options import ShardOptions
    from pipeline.data.shards.stage import run_shard_stage

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
    layout = PretrainLayout(operations / "rolled")
    # Set aside 6, 8, 10 and 12, kept for a look and never resumed from: the last 2 (checkpoint.keep_set_aside).
    assert sorted(p.name for p in layout.checkpoints.glob("rolled-back-*")) == [
        "rolled-back-step_00000010", "rolled-back-step_00000012"]
    record = read_record(newest_complete(layout.checkpoints))
    assert record.step == STEPS and record.skipped == ((6, 7),)
    events = [json.loads(line) for line in layout.metrics.read_text().splitlines()]
    assert any(e.get("skipped_steps") == "6:7" for e in events)
    ledger = read_ledger(layout.ledger).events
    assert ledger[0] == SkipEvent(6, 7, at_step=4, time=ledger[0].time)
    assert [e.folder for e in ledger[1:]] == [f"rolled-back-step_{s:08d}" for s in range(6, STEPS + 1, 2)]


@pytest.mark.slow
def test_a_second_rollback_past_the_first_skip_still_leaves_its_steps_out(operations):
    """`rolled-twice` names only steps 3:3; the ledger keeps 6:7, which step 2's checkpoint knew nothing of."""
    (full, full_lr), (twice, twice_lr) = seen(operations, "full"), seen(operations, "rolled-twice")
    for rank in range(2):
        assert sorted(twice[rank]) == [4, 5, *range(8, STEPS + 1)]
        assert all(twice[rank][s] == full[rank][s] for s in twice[rank])
        assert all(twice_lr[rank][s] == pytest.approx(full_lr[rank][s]) for s in twice_lr[rank])
    layout = PretrainLayout(operations / "rolled-twice")
    assert read_record(newest_complete(layout.checkpoints)).skipped == ((3, 3), (6, 7))
    skips = [e.steps for e in read_ledger(layout.ledger).events if isinstance(e, SkipEvent)]
    assert skips == [range(5, 7), range(2, 3)]  # in the order they were asked for


@pytest.mark.slow
def test_the_wait_share_is_the_slowest_ranks(operations):
    """In `rolled-twice` rank 1's loader takes 0.3 s a micro batch and rank 0's keeps ahead: rank 0 spends that time
    in the gradients' all-reduce, which its own clock counts as compute."""
    metrics = PretrainLayout(operations / "rolled-twice").metrics
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    shares = [r["train/data_wait_share"] for r in records if "train/data_wait_share" in r and r["step"] > 2]
    assert len(shares) == 7 and min(shares) > 0.5, shares
    assert next(r["summary/data_wait_share"] for r in records if "summary/data_wait_share" in r) > 0.5


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
    from pipeline.pretrain.plan.stream import DataStream
    from pipeline.pretrain.preflight import recorded_plan

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


def run_with_checkpoints(root: Path, shards: Path, tokenizer: Path, steps: dict[int, tuple], **checkpoint) -> Path:
    """A run's config (10,000 steps, a checkpoint every 1,000 unless `checkpoint` says otherwise) and complete
    checkpoints at `steps`, each recording the ranges it skipped ({step: ((A, B), ...)}): records only, all the
    preflight reads."""
    from helpers import record_at

    run = root / "run"
    for step, skipped in steps.items():
        folder = PretrainLayout(run).checkpoints / tag_for(step)
        folder.mkdir(parents=True)
        write_record(folder, record_at(step, skipped=skipped))
    config = tiny_pretrain_config(shards, tokenizer, run, train={"max_steps": 10_000},
                                  checkpoint={"every": 1000, "keep_last": 2, **checkpoint})
    return write_config(root / "config.json", config)


def test_a_skip_that_no_kept_checkpoint_precedes_is_refused_unless_a_restart_is_asked_for(
        tmp_path, roberta_shards, bpe_tokenizer_dir):
    """A spike noticed late: checkpoints at 7,000 and 8,000 (keep_last 2), and steps 6501-6550 to skip."""
    from pipeline.pretrain.preflight import prepare_run

    config = run_with_checkpoints(tmp_path, roberta_shards, bpe_tokenizer_dir, {7000: (), 8000: ()})
    with pytest.raises(ConfigError) as refused:
        prepare_run(config, ['train.skip_steps=["6501:6550"]'])
    message = str(refused.value)
    assert ("train.skip_steps 6501:6550: a rollback to before step 6501 needs a checkpoint from step 6500 or "
            "earlier (the newest the cadence saved: step_00006000, checkpoint.every 1000); the kept checkpoints "
            "(step_00007000, step_00008000, checkpoint.keep_last 2) all trained on those steps") in message
    assert "--restart-from-scratch (train.restart_from_scratch true)" in message
    checkpoints = PretrainLayout(tmp_path / "run").checkpoints
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_00007000", "step_00008000"]  # nothing moved
    assert not PretrainLayout(tmp_path / "run").ledger.exists()

    later = prepare_run(config, ['train.skip_steps=["7501:7550"]'])  # a checkpoint before it is kept: it rolls back
    assert later.start.step == 7000 and [p.name for p in later.rolled_back] == ["step_00008000"]
    restart = prepare_run(config, ['train.skip_steps=["6501:6550"]', "train.restart_from_scratch=true"])
    assert restart.start is None and restart.skipped == (range(6500, 6550),)
    assert sorted(p.name for p in restart.rolled_back) == ["step_00007000", "step_00008000"]

    from pipeline.commands import pretrain as launcher

    assert launcher.overrides(launcher.parse_args(["--config", "c.json", "--restart-from-scratch"])) == [
        "train.restart_from_scratch=true"]


def test_the_ledgers_skips_hold_at_every_resume_so_a_second_rollback_keeps_the_first(
        tmp_path, roberta_shards, bpe_tokenizer_dir):
    """Steps 6-7 were skipped (the checkpoints after them say so); now steps 3-3 are, from step 2's checkpoint,
    which knew nothing of the first skip. The config names only the new range, as `--skip-steps 3:3` does."""
    from pipeline.pretrain.preflight import prepare_run

    config = run_with_checkpoints(tmp_path, roberta_shards, bpe_tokenizer_dir,
                                  {2: (), 4: (), 8: ((6, 7),), 10: ((6, 7),)}, every=2, keep_last=20)
    ledger = read_ledger(PretrainLayout(tmp_path / "run").ledger).append([SkipEvent(6, 7, at_step=4)])
    plan = prepare_run(config, ['train.skip_steps=["3:3"]'])
    assert plan.start.step == 2 and sorted(p.name for p in plan.rolled_back) == [tag_for(s) for s in (4, 8, 10)]
    assert plan.skipped == (range(2, 3), range(5, 7))  # the first skip too, which step 2's record never held
    assert plan.unrecorded_skips == (range(2, 3),)  # the start adds it to the ledger

    ledger.path.unlink()  # without the ledger: the first skip is forgotten, its steps would train again
    assert prepare_run(config, ['train.skip_steps=["3:3"]']).skipped == (range(2, 3),)


def test_the_ledger_refuses_a_damaged_line_or_an_event_it_does_not_know_naming_the_line(tmp_path):
    path = tmp_path / "ledger.jsonl"
    read_ledger(path).append([SkipEvent(6, 7, at_step=4), SetAsideEvent("rolled-back-step_00000008", "rolled-back", 4)])
    ledger = read_ledger(path)
    assert ledger.skipped == (range(5, 7),) and ledger.events[1].folder == "rolled-back-step_00000008"
    assert all(e.time for e in ledger.events)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], '{"event": "skip", "steps": "9"', lines[1]]) + "\n")
    with pytest.raises(PipelineError, match=f"{path} line 2: the run's ledger is damaged"):
        read_ledger(path)
    path.write_text("\n".join([lines[0], '{"event": "spike", "step": 9}']) + "\n")
    with pytest.raises(PipelineError, match=f"{path} line 2: event 'spike' is not one this roberta-pipeline knows"):
        read_ledger(path)


def test_set_aside_checkpoints_beyond_the_bound_go_the_first_set_aside_first_and_never_a_live_one(
        tmp_path, roberta_shards, bpe_tokenizer_dir):
    import os

    from pipeline.common.processes.topology import Topology
    from pipeline.pretrain.checkpointer import Checkpointer
    from pipeline.pretrain.preflight import prepare_run

    config = run_with_checkpoints(tmp_path, roberta_shards, bpe_tokenizer_dir,
                                  {2: (), 4: (), 8: (), 10: (), 12: ()}, every=2, keep_last=20)
    checkpoints = PretrainLayout(tmp_path / "run").checkpoints
    for age, name in enumerate(["damaged-step_00000014", "rolled-back-step_00000006"]):  # set aside long ago
        (checkpoints / name).mkdir()
        os.utime(checkpoints / name, (1000 + age, 1000 + age))
    plan = prepare_run(config, ['train.skip_steps=["9:9"]', "checkpoint.keep_set_aside=3"])
    checkpointer = Checkpointer(plan.config, Topology(0, 0, 1, False), reporter=None)
    checkpointer.open_run(plan)
    checkpointer.release()
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "rolled-back-step_00000006", "rolled-back-step_00000010", "rolled-back-step_00000012",
        "step_00000002", "step_00000004", "step_00000008"]  # the start (8) and every live checkpoint kept
    events = read_ledger(PretrainLayout(tmp_path / "run").ledger).events
    assert events == (SkipEvent(9, 9, 8, events[0].time), SetAsideEvent("rolled-back-step_00000010", "rolled-back",
                      8, events[1].time), SetAsideEvent("rolled-back-step_00000012", "rolled-back", 8, events[2].time))

    from pipeline.common.config.tree import SectionProblems
    from pipeline.pretrain.config import CheckpointConfig

    assert CheckpointConfig().keep_set_aside == 2
    with pytest.raises(SectionProblems, match=r"checkpoint.keep_set_aside: must be ≥ 0, got -1"):
        CheckpointConfig(keep_set_aside=-1)
