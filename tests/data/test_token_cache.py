"""The node's shard cache: nothing prepared before the first step, each shard checked before use, bounded on disk."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from pipeline.common.errors import PipelineError
from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.data.epoch_order import CorpusLayout
from pipeline.data.shards.index import load_index
from pipeline.data.shards.reader import ShardedDataset
from pipeline.data.token_cache import TokenCache
from pipeline.pretrain.batches.masked_slots import dense_labels
from pipeline.pretrain.batches.stretch_data import MaskedBatches, RankKeys, train_loader
from pipeline.pretrain.plan.masking import Masker
from pipeline.pretrain.plan.stream import DataStream


@pytest.fixture
def shards(tmp_path, roberta_shards):
    copy = tmp_path / "shards"
    shutil.copytree(roberta_shards, copy)
    return copy


def cached_files(cache: TokenCache) -> list[str]:
    return sorted(p.name for p in cache.folder.glob("*.raw")) if cache.folder.exists() else []


def test_opening_a_folder_reads_no_shard_and_writes_nothing(shards, tmp_path):
    cache = TokenCache(shards, "train", tmp_path / "cache")
    assert len(cache) == load_index(shards)["splits"]["train"]["sequences"] and cached_files(cache) == []
    rows = np.array([5, 250, 17])
    assert np.array_equal(cache.fields["input_ids"][rows],
                          np.stack([ShardedDataset(shards, "train")[i]["input_ids"] for i in rows]))
    assert cached_files(cache) == ["0000000.raw", "0000002.raw"]  # the two shards those rows are in


def test_a_corrupt_shard_is_named_when_first_touched_and_none_of_it_is_used(shards, tmp_path):
    entry = load_index(shards)["splits"]["train"]["shards"][1]
    shard = shards / entry["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    shard.write_bytes(bytes(data))
    cache = TokenCache(shards, "train", tmp_path / "cache")
    assert cache.fields["input_ids"][np.array([0, 99])].shape == (2, 64)  # shard 0 is fine
    with pytest.raises(PipelineError, match=rf"shard {shard} is corrupt or truncated: its sha256"):
        cache.fields["input_ids"][np.array([3, 150])]  # row 150: shard 1
    assert cached_files(cache) == ["0000000.raw"]  # nothing of shard 1 reached the cache


def test_a_truncated_or_missing_shard_is_named_before_the_first_step(shards, tmp_path):
    shard = shards / load_index(shards)["splits"]["train"]["shards"][2]["file"]
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(PipelineError, match=rf"shard {shard} is corrupt or truncated: .* bytes, index.json says"):
        TokenCache(shards, "train", tmp_path / "cache")
    shard.unlink()
    with pytest.raises(PipelineError, match=rf"shard {shard} is missing"):
        TokenCache(shards, "train", tmp_path / "cache")


def test_an_epoch_read_through_workers_keeps_the_cache_within_two_blocks(shards, tmp_path):
    cache = TokenCache(shards, "train", tmp_path / "cache", shards_per_block=1)  # the fixture has four shards
    assert cache.layout.shards_per_block == 1 and cache.capacity == 2 and len(cache.layout.sizes) == 4
    plan = BatchPlan.derive(30, 30, 1)
    steps = len(cache) // 30
    shuffle = DataStream([CorpusLayout("x", "", 0, cache.layout.sizes, 1, cache.seq_len)], plan, seed=0)
    masker = Masker(400, 4, (0, 1, 2, 3, 4), seed=0)
    batches = MaskedBatches(cache, masker, with_segments=False)
    source = ShardedDataset(shards, "train")
    seen, most = [], 0
    for key, batch in zip(RankKeys(shuffle, 0, 0, steps),
                          train_loader(batches, shuffle, rank=0, start_step=0, end_step=steps, num_workers=1),
                          strict=True):
        labels = dense_labels(batch).numpy()
        want = np.stack([source[int(i)]["input_ids"] for i in key.indices])
        assert np.array_equal(labels[labels >= 0], want[labels >= 0])
        seen.append(key.indices)
        most = max(most, len(cached_files(cache)))
    assert most <= cache.capacity
    assert len(np.unique(np.concatenate(seen))) == steps * 30  # one epoch's draws, no repeats
