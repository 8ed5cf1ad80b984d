"""A decompressed, memory-mapped copy of one split of a shard folder, for random access in training.

A global shuffle reads sequences in random order. From zstd shards that would decompress a whole
shard per sequence (or hold every shard in memory); a flat `.npy` per field, memory-mapped, costs
one page-cache read per sequence instead, and the operating system shares it between all ranks
and DataLoader workers of a node. It is built once (about 1.4× the shards' size on disk): every
shard is sha256-checked while it is copied, so a corrupt or truncated shard stops the run before
the first step with an error naming the file. A file lock lets one process build it while the
other ranks wait; the build is written to a temporary folder and renamed, so a killed build never
leaves a cache that looks complete.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import publish_folder, reporting_disk_full
from pipeline.common.errors import PipelineError
from pipeline.data.shard_index import shard_path
from pipeline.data.shard_reader import ShardedDataset


class TokenCache:
    """Fields of one split as read-only memory-mapped arrays: `cache.fields["input_ids"][rows]`."""

    def __init__(self, shards: str | Path, split: str, cache_root: str | Path,
                 *, seq_len: int | None = None, tokenizer_fingerprint: str | None = None):
        self.source = ShardedDataset(shards, split, seq_len=seq_len, tokenizer_fingerprint=tokenizer_fingerprint,
                                     cache_shards=1)
        digest = hashlib.sha256(json.dumps(self.source.shards, sort_keys=True).encode()).hexdigest()[:16]
        self.folder = Path(cache_root) / f"{split}-{digest}"
        if not (self.folder / "done.json").exists():
            self._build_once(Path(cache_root))
        fields = json.loads((self.folder / "done.json").read_text())["fields"]
        self.fields = {name: np.load(self.folder / f"{name}.npy", mmap_mode="r") for name in fields}

    def __len__(self) -> int:
        return len(self.source)

    @property
    def seq_len(self) -> int:
        return self.source.seq_len

    @property
    def num_tokens(self) -> int:
        return self.source.num_tokens

    def _build_once(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (self.folder / "done.json").exists():
                self._build()

    def _build(self) -> None:
        tmp = self.folder.with_name(self.folder.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            with reporting_disk_full(self.folder):
                self._fill(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone after a failure; renamed away after success

    def _fill(self, tmp: Path) -> None:
        source = self.source
        # Every listed shard is there with its listed size before the cache is sized from the index's counts.
        for entry in source.shards:
            path = shard_path(source.folder, entry["file"])
            size = path.stat().st_size if path.is_file() else None
            if size is None:
                raise PipelineError(f"shard {path} is missing (listed in index.json); run "
                                    f"data_prep/verify_shards.py {source.folder}")
            if size != entry.get("bytes", size):
                raise PipelineError(f"shard {path} is corrupt or truncated: {size:,} bytes, index.json says "
                                    f"{entry['bytes']:,} (run data_prep/verify_shards.py {source.folder})")
        outputs: dict[str, np.ndarray] = {}
        row = 0
        for shard in range(len(source.shards)):
            arrays = source._load(shard)  # checks the shard's sha256 and row count
            for name, values in arrays.items():
                if name not in outputs:
                    path = tmp / f"{name}.npy"
                    outputs[name] = np.lib.format.open_memmap(
                        path, mode="w+", dtype=values.dtype, shape=(len(source),) + values.shape[1:])
                    _reserve(path)
                outputs[name][row: row + len(values)] = values
            row += len(arrays["input_ids"])
        if row != len(source):
            raise PipelineError(f"{source.folder}: the {source.split} shards hold {row} sequences, "
                                f"index.json says {len(source)}")
        for array in outputs.values():
            array.flush()
        (tmp / "done.json").write_text(json.dumps({"fields": sorted(outputs), "sequences": row}))
        # Another node (which does not share our lock) may have built it meanwhile: keep theirs.
        publish_folder(tmp, self.folder, replace=False)


class ConcatenatedCaches:
    """Several corpora's token caches as one row space: row `offsets[c] + i` is corpus c's row i."""

    def __init__(self, caches: list[TokenCache]):
        self.caches = caches
        self.offsets = np.cumsum([0] + [len(c) for c in caches])
        self.fields = {name: _ConcatenatedField(self, name) for name in caches[0].fields}

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def seq_len(self) -> int:
        return self.caches[0].seq_len

    def corpus_of(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, rows, side="right") - 1


class _ConcatenatedField:
    """`field[rows]` gathered from each corpus's memory map (rows keep their order)."""

    def __init__(self, owner: ConcatenatedCaches, name: str):
        self.owner, self.name = owner, name

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows)
        owner = self.owner
        first = owner.caches[0].fields[self.name]
        out = np.empty((len(rows),) + first.shape[1:], dtype=first.dtype)
        corpus = owner.corpus_of(rows)
        for c in np.unique(corpus):
            mine = corpus == c
            out[mine] = owner.caches[c].fields[self.name][rows[mine] - owner.offsets[c]]
        return out


def _reserve(path: Path) -> None:
    """Allocate a memory-mapped file's blocks now: a full disk is then ENOSPC here, not SIGBUS on a later
    write through the map."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate: nothing to do
            return
        raise
    finally:
        os.close(fd)
