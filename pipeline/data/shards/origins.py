"""Which documents each sequence of a shard folder holds: their input file and line (or record number).

The shard stage gives every document a key, its input file's number and its line packed into one
int64 (`origin_keys`), and the packers report, per sequence, the keys of the documents whose
tokens it holds, in order (`pipeline.data.packers`). Beside each shard the writer stores them as
`<shard>.origins.zst` (`encode_origins`): the shard container holding three arrays, every one
delta-encoded in the narrowest integer type that fits and zstd-compressed, since neighbouring
documents of a shard mostly come from one file and nearby lines:

    documents    (sequences,)  how many documents each sequence holds
    file_deltas  (documents,)  each document's file number minus the previous document's
    line_deltas  (documents,)  each document's line minus the previous document's

`index.json` lists each origins file in its shard's entry (`"origins": {file, bytes, sha256, part}`)
and names the input files once (`"origins": {"files": [...], "line_offsets": [...]}`). Lines are
1-based lines of txt/jsonl files (a blank-line-separated document's first line), 1-based parquet
rows, and 1-based record numbers of `hf:` datasets. A rank that read a byte range of a file counts
lines from its range's first line; the index's `line_offsets[part]` holds the lines before it.

`OriginReader(folder, split).documents(rows)` answers for row numbers as `ShardedDataset` and
`TokenCache` number them. Shards made before origins existed have none: `available` is False.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import sha256_bytes
from pipeline.common.errors import PipelineError
from pipeline.data.shards.format import ShardFormatError, decode, encode
from pipeline.data.shards.index import HEADER_BYTES, SPLITS, load_index, shard_path

LINE_BITS = 40
"""A key's low bits hold the line (up to 2^40 - 1, about 10^12); the bits above, the input file's number."""
LEVEL = 19
"""zstd level of origins files: they are a few KB a shard, so the slowest levels still cost milliseconds."""
ARRAYS = ("documents", "file_deltas", "line_deltas")


@dataclass(frozen=True)
class DocumentOrigin:
    """Where one document came from."""

    file: str
    """The input file as index.json names it: its absolute path (`hf:NAME` for a datasets dataset)."""
    line: int
    """1-based: the line of a txt/jsonl file, the row of a parquet file, the record of a dataset."""


def origin_keys(file: int, lines: np.ndarray) -> np.ndarray:
    """The keys of documents at `lines` of input file number `file`."""
    return (np.int64(file) << LINE_BITS) | np.asarray(lines, np.int64)


def origin_name(path: str, fmt: str) -> str:
    """How index.json names an input: its absolute path (a relative `--input` is taken from the shard stage's
    folder, and a trace runs from anywhere), or `hf:NAME` for a datasets dataset."""
    return f"hf:{path}" if fmt == "hf" else os.path.abspath(path)


def _narrow(values: np.ndarray) -> np.ndarray:
    """The values in the narrowest signed integer type that holds them (zstd packs small types better)."""
    low, high = (int(values.min()), int(values.max())) if len(values) else (0, 0)
    for dtype in (np.int8, np.int16, np.int32):
        if np.iinfo(dtype).min <= low and high <= np.iinfo(dtype).max:
            return values.astype(dtype)
    return values.astype(np.int64)


def encode_origins(counts: np.ndarray, keys: np.ndarray) -> bytes:
    """An origins file's bytes: per sequence, how many documents, and each document's key, delta-encoded."""
    keys = np.asarray(keys, np.int64)
    files, lines = keys >> LINE_BITS, keys & ((1 << LINE_BITS) - 1)
    arrays = {"documents": _narrow(np.asarray(counts, np.int64)),
              "file_deltas": _narrow(np.diff(files, prepend=0)), "line_deltas": _narrow(np.diff(lines, prepend=0))}
    return encode(arrays, {"content": "document origins"}, LEVEL)


def origins_byte_bound(sequences: int, seq_len: int) -> int:
    """The most bytes an origins file may decompress to: a sequence holds at most seq_len documents."""
    return sequences * (8 + 16 * seq_len) + HEADER_BYTES


class OriginReader:
    """The documents of rows of one split of a shard folder."""

    def __init__(self, shards_folder: str | Path, split: str):
        if split not in SPLITS:
            raise PipelineError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
        self.folder = Path(shards_folder)
        self.split = split
        self.index = load_index(self.folder)
        self.shards = self.index["splits"][split]["shards"]
        origins = self.index.get("origins")
        self.available: bool = origins is not None and all("origins" in s for s in self.shards)
        """False for shards made before the stage recorded origins."""
        self.files: list[str] = origins["files"] if origins else []
        self._offsets = [dict(map(tuple, part)) for part in origins["line_offsets"]] if origins else []
        self._starts = np.cumsum([0] + [s["sequences"] for s in self.shards]).tolist()

    def documents(self, rows: Iterable[int]) -> list[list[DocumentOrigin]]:
        """Each row's documents, in the order their tokens appear in it."""
        rows = [int(r) for r in rows]
        if not self.available:
            raise PipelineError(f"{self.folder}: its {self.split} shards were made before the shard stage recorded "
                                "document origins; rerun data_prep/shard.py into a new folder to have them")
        total = self._starts[-1]
        if bad := [r for r in rows if not 0 <= r < total]:
            raise PipelineError(f"{self.folder}: {self.split} row {bad[0]} is out of range (it holds {total:,} rows)")
        by_shard: dict[int, list[int]] = {}
        for row in rows:
            by_shard.setdefault(bisect.bisect_right(self._starts, row) - 1, []).append(row)
        found: dict[int, list[DocumentOrigin]] = {}
        for shard, shard_rows in by_shard.items():
            bounds, files, lines = self._load(shard)
            for row in shard_rows:
                i = row - self._starts[shard]
                span = slice(bounds[i], bounds[i + 1])
                found[row] = [DocumentOrigin(self.files[f], line) for f, line in
                              zip(files[span].tolist(), lines[span].tolist(), strict=True)]
        return [found[row] for row in rows]

    def _load(self, shard: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Shard `shard`'s origins, checked: (row bounds into the documents, file numbers, lines)."""
        entry = self.shards[shard]
        meta = entry["origins"]
        path = shard_path(self.folder, meta["file"])
        try:
            data = path.read_bytes() if path.stat().st_size == meta["bytes"] else b""  # a wrong size is not read
        except OSError as err:
            raise PipelineError(f"origins file {path}: cannot read it ({err.strerror or err}); it is listed in "
                                f"{self.folder / 'index.json'}") from None
        if len(data) != meta["bytes"] or sha256_bytes(data) != meta["sha256"]:
            raise PipelineError(f"origins file {path} is corrupt or truncated: its size or sha256 does not match "
                                f"index.json (run data_prep/verify_shards.py {self.folder})")
        try:
            arrays, _ = decode(data, str(path), origins_byte_bound(entry["sequences"], self.index["seq_len"]))
        except ShardFormatError as err:
            raise PipelineError(f"origins file {path}: {err}") from None
        if problem := self._problem(arrays, entry["sequences"]):
            raise PipelineError(f"origins file {path}: {problem}")
        counts = arrays["documents"].astype(np.int64)
        files = np.cumsum(arrays["file_deltas"], dtype=np.int64)
        lines = np.cumsum(arrays["line_deltas"], dtype=np.int64)
        if len(files) and (files.min() < 0 or files.max() >= len(self.files) or lines.min() < 1):
            raise PipelineError(f"origins file {path}: names a file number or line outside index.json's "
                                f"{len(self.files)} input files")
        offsets = self._offsets[meta["part"]] if meta["part"] < len(self._offsets) else {}
        for file, offset in offsets.items():
            lines[files == file] += offset
        return np.concatenate([[0], np.cumsum(counts)]), files, lines

    @staticmethod
    def _problem(arrays: dict[str, np.ndarray], sequences: int) -> str | None:
        if set(arrays) != set(ARRAYS) or any(a.ndim != 1 or a.dtype.kind != "i" for a in arrays.values()):
            return f"expected the integer arrays {', '.join(ARRAYS)}, got {sorted(arrays)}"
        counts = arrays["documents"]
        if len(counts) != sequences or (len(counts) and counts.min() < 0):
            return f"holds {len(counts)} sequences' counts, index.json lists {sequences} sequences"
        if int(counts.sum()) != len(arrays["file_deltas"]) or len(arrays["file_deltas"]) != len(arrays["line_deltas"]):
            return "its document counts and documents do not add up"
        return None
