"""Batches: masked micro batches gathered from the token cache, evaluation sets, and the loader's workers
(the order they follow is test_stream.py's)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time

import numpy as np
import psutil
import pytest
import torch
from helpers import PYTHON, ROOT, tiny_pretrain_config

from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.data.shards.reader import ShardedDataset
from pipeline.data.token_cache import TokenCache
from pipeline.pretrain.batches.masked_slots import dense_labels
from pipeline.pretrain.batches.stretch_data import (
    MaskedBatches,
    eval_keys,
    ignore_stop_signals,
    shut_down_workers,
    train_loader,
)
from pipeline.pretrain.plan.masking import IGNORE_INDEX, Masker
from pipeline.pretrain.plan.stream import DataStream


def test_eval_batches_are_the_same_on_every_call_and_split_evenly():
    keys = [eval_keys(100, 64, 8, r, 2) for r in range(2)]
    assert len(keys[0]) == len(keys[1]) == 4
    assert sorted(np.concatenate([k.indices for ks in keys for k in ks])) == list(range(64))
    # 50 sequences over 3 ranks in micro batches of 8: every rank runs the same number of forward
    # passes (ZeRO-3 would hang otherwise), on disjoint sequences.
    uneven = [eval_keys(100, 50, 8, r, 3) for r in range(3)]
    assert len({len(ks) for ks in uneven}) == 1
    seen = np.concatenate([k.indices for ks in uneven for k in ks])
    assert len(seen) == len(set(seen.tolist())) == 48


def test_masked_batches_from_the_token_cache_match_the_shards(tmp_path, roberta_shards, bpe_tokenizer_dir):
    cache = TokenCache(roberta_shards, "train", tmp_path / "cache")
    source = ShardedDataset(roberta_shards, "train")
    rows = np.array([5, 0, 17, 3])
    assert np.array_equal(cache.fields["input_ids"][rows], np.stack([source[i]["input_ids"] for i in rows]))
    masker = Masker(400, 4, (0, 1, 2, 3, 4), seed=0)
    batches = MaskedBatches(cache, masker, with_segments=False)
    from pipeline.pretrain.batches.stretch_data import MicroBatchKey

    batch = batches[MicroBatchKey(0, rows)]
    labels = dense_labels(batch).numpy()
    chosen = labels != IGNORE_INDEX
    assert np.array_equal(labels[chosen], cache.fields["input_ids"][rows][chosen])
    assert "attention_mask" not in batch  # full packing: no padding to mask


def test_pairs_batches_carry_segments_and_next_sentence_labels(tmp_path, pairs_shards):
    cache = TokenCache(pairs_shards, "train", tmp_path / "cache")
    masker = Masker(300, 4, (0, 1, 2, 3, 4), seed=0)
    from pipeline.pretrain.batches.stretch_data import MicroBatchKey

    batch = MaskedBatches(cache, masker, with_segments=True)[MicroBatchKey(0, np.arange(8))]
    lengths = cache.fields["length"][:8]
    b_start = cache.fields["segment_b_start"][:8]
    for row in range(8):
        types = batch["token_type_ids"][row].numpy()
        assert types[: b_start[row]].sum() == 0 and types[b_start[row]: lengths[row]].all()
    assert set(batch["next_sentence_label"].tolist()) <= {0, 1}


class _Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> int:
        return index


def test_a_stop_signal_to_the_process_group_leaves_the_loader_workers_serving():
    # torchrun, scancel and a terminal's Ctrl-C signal every process of the job; the rank must get
    # its next batches, stop after its step and checkpoint, rather than crash on a dead worker.
    loader = torch.utils.data.DataLoader(_Numbers(), batch_size=None, num_workers=1, worker_init_fn=ignore_stop_signals)
    batches = iter(loader)
    assert next(batches) == 0
    for worker in psutil.Process().children():
        worker.send_signal(signal.SIGTERM)
        worker.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert [next(batches) for _ in range(50)] == list(range(1, 51))


def test_the_training_loader_installs_the_signal_guard_in_its_workers():
    loader = train_loader(None, DataStream([64], BatchPlan.derive(8, 8, 1), seed=0), rank=0, start_step=0, end_step=2,
                          num_workers=1)
    assert loader.worker_init_fn is ignore_stop_signals


def test_workers_that_ignore_stop_signals_are_shut_down_on_request_while_still_referenced():
    # multiprocessing's exit handler SIGTERMs and then joins live workers: ones that ignore SIGTERM would hang
    # the process at exit, so the trainer stops them itself.
    others = {child.pid for child in psutil.Process().children()}  # other tests' helpers, if any
    loader = torch.utils.data.DataLoader(_Numbers(), batch_size=None, num_workers=2, worker_init_fn=ignore_stop_signals)
    batches = iter(loader)
    try:
        assert next(batches) == 0
        workers = [child for child in psutil.Process().children() if child.pid not in others]
        assert len(workers) == 2
        shut_down_workers(batches)
        psutil.wait_procs(workers, timeout=10)
        assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
        shut_down_workers(None)  # anything without workers: nothing to do
    finally:  # a failed assertion must not leave SIGTERM-immune workers behind to hang pytest's exit
        shut_down_workers(batches)


KEEP_LOADERS_ALIVE = textwrap.dedent("""
    import sys
    import torch.utils.data as data
    kept, iterate = [], data.DataLoader.__iter__
    data.DataLoader.__iter__ = lambda self: kept.append(iterate(self)) or kept[-1]  # alive until exit
    from pipeline.commands.pretrain import main
    main(["--config", sys.argv[1]])
""")


@pytest.mark.slow
def test_a_run_whose_loader_outlives_its_loop_still_exits(tmp_path, roberta_shards, bpe_tokenizer_dir):
    """Something holding the loader iterator past training (train.compile and CUDA runs did) must not leave its
    SIGTERM-immune workers for the exit handler to join forever."""
    config = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "run",
                                  train={"max_steps": 2, "export": False}, checkpoint={"every": 2},
                                  data={"num_workers": 2, "cache_dir": str(tmp_path / "cache")})
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = subprocess.run([PYTHON, "-c", KEEP_LOADERS_ALIVE, str(tmp_path / "config.json")], cwd=ROOT, timeout=240,
                          capture_output=True, text=True, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert done.returncode == 0, done.stderr[-2000:]
