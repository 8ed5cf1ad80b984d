"""Hostile or broken shard folders, generated (hypothesis, several hundred seeded cases per test).

Outcome for every case: a `PipelineError` naming the file and what is wrong (never another
exception, never a hang: each case has a deadline), no allocation past the bound the index's own
counts state (`shard_byte_bound`, traced with tracemalloc), and nothing outside the folder read or
written: a valid shard planted outside, whose checksum the hostile index lists, is never accepted.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import zstandard
from generated_cases import GENERATED, count, peak_allocation, write_counts
from hypothesis import given
from hypothesis import strategies as st

from pipeline.common.atomic_files import sha256_bytes
from pipeline.common.config.size_limits import MAX_SHARD_BYTES
from pipeline.common.errors import PipelineError
from pipeline.data.shards.format import FORMAT_VERSION, ShardFormatError, decode, encode
from pipeline.data.shards.index import INDEX_NAME, load_index, shard_byte_bound, verify_folder
from pipeline.data.shards.reader import ShardedDataset

SEQ_LEN = 16
SLACK = 4 << 20  # the readers' own bookkeeping (index, small arrays) on top of the shard bound


@pytest.fixture(scope="module", autouse=True)
def report_counts(tmp_path_factory):
    yield
    write_counts(tmp_path_factory.getbasetemp())


def shard_bytes(rows: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 400, size=(rows, SEQ_LEN), dtype=np.uint16)
    return encode({"input_ids": ids, "length": np.full(rows, SEQ_LEN, np.int32)})


class Workspace:
    """A valid shard folder (2 train shards, 1 val shard) and a valid shard planted outside it, made once;
    each case changes it, and `restore` puts the template back (cheaper than a new folder per case)."""

    def __init__(self, root: Path):
        self.root, self.folder = root, root / "shards"
        self.files: dict[str, bytes] = {}
        splits = {}
        for split, sizes in (("train", (5, 3)), ("val", (2,))):
            shards = []
            for i, rows in enumerate(sizes):
                data = shard_bytes(rows, seed=i)
                name = f"{split}/part00000-shard{i:06d}.zst"
                self.files[name] = data
                shards.append({"file": name, "sequences": rows, "tokens": rows * SEQ_LEN, "bytes": len(data),
                               "sha256": sha256_bytes(data)})
            splits[split] = {"shards": shards, "sequences": sum(sizes), "tokens": sum(sizes) * SEQ_LEN}
        self.index = {"format_version": FORMAT_VERSION, "seq_len": SEQ_LEN, "pack": "full", "dtype": "uint16",
                      "fields": ["input_ids", "length"], "tokenizer": {"fingerprint": "sha256:" + "0" * 64},
                      "splits": splits, "totals": {"sequences": 10}, "args": {"seq_len": SEQ_LEN}}
        (root / "outside").mkdir()
        (root / "outside" / "secret.zst").write_bytes(shard_bytes(5, seed=0))  # = train shard 0: same sha256
        self.restore(force=True)

    def restore(self, force: bool = False) -> None:
        for split in ("train", "val"):
            folder = self.folder / split
            if folder.is_symlink():
                folder.unlink()
            folder.mkdir(parents=True, exist_ok=True)
            for extra in folder.iterdir():
                if f"{split}/{extra.name}" not in self.files:
                    extra.unlink()
        for name, data in self.files.items():
            path = self.folder / name
            if force or path.is_symlink() or not path.is_file() or path.stat().st_size != len(data) \
                    or path.read_bytes() != data:
                path.unlink(missing_ok=True)
                path.write_bytes(data)
        (self.folder / INDEX_NAME).write_text(json.dumps(self.index))

    def case(self) -> tuple[Path, dict, Path]:
        self.restore()
        return self.folder, copy.deepcopy(self.index), self.root


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("hostile"))


def fresh(workspace: Workspace) -> tuple[Path, dict, Path]:
    return workspace.case()


def snapshot_outside(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in (root / "outside").rglob("*")}


def read_everything(folder: Path) -> int:
    """Every way the pipeline reads a shard folder: the index, every sequence of both splits, verify."""
    index = load_index(folder)
    read = 0
    for split in ("train", "val"):
        data = ShardedDataset(folder, split, cache_shards=1)
        for i in range(len(data)):
            data[i]
            read += 1
    problems = verify_folder(folder)
    if problems:
        raise PipelineError("; ".join(problems))
    return read + len(index["splits"])


TRACED = {"cases": 0}


def traced_sample():
    """tracemalloc on one case in three (it slows reading 4×); the others run untraced."""
    TRACED["cases"] += 1
    return peak_allocation() if TRACED["cases"] % 3 == 0 else contextlib.nullcontext({"peak": 0})


def expect_named_failure(folder: Path, root: Path, *, bound: int) -> str:
    """Reading must fail with a PipelineError naming the folder's file, within the allocation bound."""
    before = snapshot_outside(root)
    with traced_sample() as memory:
        with pytest.raises(PipelineError) as err:
            read_everything(folder)
    assert memory["peak"] <= bound + SLACK, f"allocated {memory['peak']:,} bytes, bound {bound:,}"
    assert str(folder) in str(err.value)
    assert snapshot_outside(root) == before  # nothing outside written (and the planted shard never accepted)
    return str(err.value)


# --- index.json: names that leave the folder ---------------------------------------------------------

ESCAPES = st.one_of(
    st.sampled_from(["../outside/secret.zst", "train/../../outside/secret.zst", "/etc/passwd", "/dev/zero",
                     "train/../../../../../../etc/passwd", "train/./part00000-shard000000.zst", "train/",
                     "val/../train/part00000-shard000000.zst", "train\\..\\..\\outside\\secret.zst",
                     "train/part00000-shard000000.zst\x00.txt", "~/secret.zst", "train/.hidden.zst",
                     "train//part00000-shard000000.zst", "TRAIN/part00000-shard000000.zst", "", ".", ".."]),
    st.builds(lambda ups, tail: "../" * ups + tail, st.integers(1, 12),
              st.sampled_from(["outside/secret.zst", "etc/passwd", "shards/train/part00000-shard000000.zst"])),
    st.builds(lambda tail: "/" + tail, st.text(min_size=0, max_size=40)),
    st.builds(lambda split, tail: f"{split}/{tail}", st.sampled_from(["train", "val"]),
              st.text(min_size=0, max_size=60).filter(lambda t: not t.replace("-", "").replace(".", "")
                                                      .replace("_", "").isalnum())),
)


@GENERATED
@given(name=ESCAPES, split=st.sampled_from(["train", "val"]), kind=st.sampled_from(["name", "symlink"]))
def test_shard_names_that_leave_the_folder_are_refused(workspace, name, split, kind):
    count("index.json: file names leaving the folder (../, absolute, symlinks)")
    folder, index, root = fresh(workspace)
    entry = index["splits"][split]["shards"][0]
    if kind == "name":
        entry["file"] = name
        secret = (root / "outside" / "secret.zst").read_bytes()
        entry.update(bytes=len(secret), sha256=sha256_bytes(secret))  # as if the index were made for that file
        (folder / INDEX_NAME).write_text(json.dumps(index))
    else:  # a listed name that is fine, but the file is a symlink out of the folder (or the split folder is)
        target = folder / entry["file"]
        target.unlink()
        link_to = root / "outside" / "secret.zst" if split == "train" else Path("/etc/hostname")
        target.symlink_to(link_to)
        if split == "train" and name.startswith("/"):  # sometimes the whole split folder is the link
            shutil.rmtree(folder / "train")
            (folder / "train").symlink_to(root / "outside", target_is_directory=True)
            entry["file"] = "train/secret.zst"
            (folder / INDEX_NAME).write_text(json.dumps(index))
    message = expect_named_failure(folder, root, bound=0)
    assert any(word in message for word in ("inside the folder", "leads outside", "is a link", "sha256",
                                            "not listed", "missing"))


# --- index.json: absurd sizes, counts and types ------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
ABSURD_NUMBERS = st.one_of(st.sampled_from([-1, 0, 10**9, 10**12, 2**31, 2**32, 2**63, 2**64, 10**100, -(2**63)]),
                           st.integers(-(2**80), 2**80), st.floats(), st.text(max_size=5), st.none(), st.booleans())


def paths_of(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from paths_of(inner, (*prefix, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from paths_of(inner, (*prefix, i))


def replace_at(index: dict, path: tuple, value) -> dict:
    if not path:
        return value
    out = copy.deepcopy(index)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


COUNT_KEYS = [("seq_len",), ("splits", "train", "shards", 0, "sequences"), ("splits", "train", "shards", 0, "tokens"),
              ("splits", "train", "shards", 0, "bytes"), ("splits", "train", "sequences"),
              ("splits", "val", "shards", 0, "sequences"), ("splits", "val", "tokens"), ("format_version",)]


@GENERATED
@given(data=st.data())
def test_absurd_sizes_counts_and_types_in_the_index_are_named(workspace, data):
    count("index.json: absurd sizes, counts and types")
    folder, index, root = fresh(workspace)
    if data.draw(st.booleans(), label="a count key"):
        path = data.draw(st.sampled_from(COUNT_KEYS), label="key")
        value = data.draw(ABSURD_NUMBERS, label="value")
    else:
        path = data.draw(st.sampled_from(sorted(paths_of(index), key=str)), label="key")
        value = data.draw(JSON_VALUES, label="value")
    hostile = replace_at(index, path, value)
    (folder / INDEX_NAME).write_text(json.dumps(hostile))
    before = snapshot_outside(root)
    with traced_sample() as memory:
        try:
            read_everything(folder)
        except PipelineError as err:
            assert str(folder) in str(err)
    # A change the readers may accept (an unused key, an equal value) must still read within the bound.
    assert memory["peak"] <= 2 * MAX_SHARD_BYTES // 1024 + SLACK  # the sample's shards are tiny: far below
    assert snapshot_outside(root) == before


# --- zstd frames that claim or expand past their size --------------------------------------------------

def frame_content_size_offset(frame: bytes) -> tuple[int, int]:
    """(offset, width) of a zstd frame header's Frame_Content_Size field (RFC 8878 §3.1.1.1)."""
    descriptor = frame[4]
    fcs_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    width = {0: 1 if single_segment else 0, 1: 2, 2: 4, 3: 8}[fcs_flag]
    offset = 5 + (0 if single_segment else 1) + {0: 0, 1: 1, 2: 2, 3: 4}[dict_flag]
    return offset, width


def with_claimed_size(frame: bytes, claimed: int) -> bytes:
    offset, width = frame_content_size_offset(frame)
    fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[width]
    if width == 2:
        claimed -= 256  # the 2-byte field stores size - 256
    claimed = max(0, min(claimed, 2 ** (8 * width) - 1))
    return frame[:offset] + struct.pack(fmt, claimed) + frame[offset + width:]


def container(payload_rows: int, filler: str) -> bytes:
    """Raw (uncompressed) container bytes of `payload_rows` rows of SEQ_LEN uint16 tokens."""
    ids = np.zeros((payload_rows, SEQ_LEN), np.uint16) if filler == "zeros" else \
        np.random.default_rng(payload_rows).integers(0, 400, (payload_rows, SEQ_LEN), dtype=np.uint16)
    return zstandard.ZstdDecompressor().decompress(encode({"input_ids": ids,
                                                           "length": np.full(payload_rows, SEQ_LEN, np.int32)}))


@GENERATED
@given(listed_rows=st.integers(1, 64), real_rows=st.integers(1, 40_000), filler=st.sampled_from(["zeros", "random"]),
       claim=st.one_of(st.none(), st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2**32 - 1, 10**9])),
       write_size=st.booleans(), mutate=st.integers(0, 3))
def test_zstd_frames_that_claim_or_expand_past_their_size_are_bounded(workspace, listed_rows, real_rows, filler,
                                                                       claim, write_size, mutate):
    count("zstd frame claiming or expanding past its declared size")
    raw = container(real_rows, filler)
    frame = zstandard.ZstdCompressor(level=1, write_content_size=write_size).compress(raw)
    if claim is not None and write_size:
        frame = with_claimed_size(frame, claim)
    if mutate == 1:
        frame = frame[: max(6, len(frame) // 2)]  # truncated
    elif mutate == 2:
        frame = frame + frame  # two frames
    bound = shard_byte_bound({"sequences": listed_rows}, SEQ_LEN, ["input_ids", "length"])
    # 1) The decoder alone, with the bound a reader derives from the index.
    with peak_allocation() as memory:
        try:
            arrays, _ = decode(frame, "hostile.zst", bound)
            assert len(raw) <= bound and arrays["input_ids"].shape == (real_rows, SEQ_LEN)
        except ShardFormatError as err:
            assert str(err).startswith("hostile.zst: ")
    assert memory["peak"] <= bound + SLACK, f"allocated {memory['peak']:,}, bound {bound:,}"
    # 2) Through a shard folder whose index lists this frame with its true checksum (so only the bound stops it).
    folder, index, root = fresh(workspace)
    entry = index["splits"]["train"]["shards"][1]
    (folder / entry["file"]).write_bytes(frame)
    entry.update(bytes=len(frame), sha256=sha256_bytes(frame), sequences=listed_rows, tokens=0)
    index["splits"]["train"].update(sequences=5 + listed_rows, tokens=5 * SEQ_LEN)
    (folder / INDEX_NAME).write_text(json.dumps(index))
    if real_rows != listed_rows or mutate or claim is not None:
        expect_named_failure(folder, root, bound=bound)


# --- random bytes in place of a shard -------------------------------------------------------------------

@GENERATED
@given(payload=st.one_of(st.binary(max_size=4096), st.builds(lambda n: os.urandom(n), st.integers(0, 200_000)),
                         st.builds(lambda b: b"\x28\xb5\x2f\xfd" + b, st.binary(max_size=512)),  # zstd magic + junk
                         st.builds(lambda b: zstandard.ZstdCompressor().compress(b"RPSHARD1" + b),
                                   st.binary(max_size=512))),  # a valid frame around a junk container
       listed=st.booleans())
def test_random_bytes_in_place_of_a_shard_are_named(workspace, payload, listed):
    count("random bytes in place of a shard")
    folder, index, root = fresh(workspace)
    entry = index["splits"]["train"]["shards"][0]
    (folder / entry["file"]).write_bytes(payload)
    if listed:  # the index lists these very bytes: the container checks, not the checksum, must catch them
        entry.update(bytes=len(payload), sha256=sha256_bytes(payload))
        (folder / INDEX_NAME).write_text(json.dumps(index))
    bound = shard_byte_bound(entry, SEQ_LEN, index["fields"])
    message = expect_named_failure(folder, root, bound=bound)
    assert entry["file"].split("/")[-1] in message
