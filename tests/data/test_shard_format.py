"""The shard container: lossless round trip, deterministic bytes, corruption detected."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.common.atomic_files import write_atomic
from pipeline.data.shards.format import ShardFormatError, decode, encode


def sample_arrays():
    rng = np.random.default_rng(0)
    return {"input_ids": rng.integers(0, 50_000, (7, 16)).astype(np.uint16),
            "nsp_label": rng.integers(0, 2, 7).astype(np.int8),
            "length": rng.integers(3, 16, 7).astype(np.int32)}


def test_round_trip_keeps_every_field_dtype_shape_and_metadata():
    arrays = sample_arrays()
    back, meta = decode(encode(arrays, {"split": "train"}))
    assert meta == {"split": "train"} and set(back) == set(arrays)
    for name, values in arrays.items():
        assert back[name].dtype == values.dtype and np.array_equal(back[name], values), name


def test_same_arrays_always_give_the_same_bytes():
    arrays = sample_arrays()
    reordered = dict(reversed(list(arrays.items())))
    assert encode(arrays) == encode(sample_arrays()) == encode(reordered)


def test_truncated_or_foreign_bytes_are_rejected_with_the_name():
    data = encode(sample_arrays())
    with pytest.raises(ShardFormatError, match="x.zst: cannot decompress"):
        decode(data[: len(data) // 2], "x.zst")
    import zstandard

    with pytest.raises(ShardFormatError, match="y.zst: not a shard file"):
        decode(zstandard.ZstdCompressor().compress(b"hello world, not a shard"), "y.zst")


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["f.bin"]
