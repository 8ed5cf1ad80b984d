"""A node's small cache of decompressed shards, filled as training first touches each shard.

Training reads sequences in random order, and from a zstd shard that would mean decompressing the
whole shard per sequence. So each shard, the first time any rank or DataLoader worker of a node
needs it, is checked (its size and sha256 against `index.json`), decompressed once (the bound its
counts imply) and written to `<cache_dir>/<split>-<digest>/<shard>.raw`; every process then
memory-maps that file, so the operating system shares one copy between all ranks and workers of
the node. A corrupt or truncated shard stops the run with an error naming it before any of its
bytes are used, and a cache file exists only once its shard passed that check (it is written
beside and renamed into place).

Nothing is prepared before the first step, and the cache is bounded: the epoch order
(`epoch_order.py`) reads the shards one block at a time, so the cache keeps the files of the last
two blocks' worth of shards (`capacity`) and deletes older ones, whatever the corpus size. A
process that still maps a deleted file keeps reading it (POSIX keeps unlinked files while they are
mapped); one that needs it again rebuilds it from the checked shard. Before the first step only
each shard's size is checked (a stat), so a missing or truncated shard is still named up front.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import reporting_disk_full
from pipeline.common.errors import PipelineError
from pipeline.data.epoch_order import ShardLayout, default_shards_per_block
from pipeline.data.shards.reader import ShardedDataset


class TokenCache:
    """Fields of one split, gathered by row from the node's shard cache: `cache.fields["input_ids"][rows]`."""

    def __init__(self, shards: str | Path, split: str, cache_root: str | Path,
                 *, seq_len: int | None = None, tokenizer_fingerprint: str | None = None,
                 shards_per_block: int | None = None):
        """`shards_per_block`: the order's block (a run's plan records it); None: today's default for the folder."""
        self.source = ShardedDataset(shards, split, seq_len=seq_len, tokenizer_fingerprint=tokenizer_fingerprint,
                                     cache_shards=1)
        digest = hashlib.sha256(json.dumps(self.source.shards, sort_keys=True).encode()).hexdigest()[:16]
        self.folder = Path(cache_root) / f"{split}-{digest}"
        self._check_sizes()
        sizes = tuple(entry["sequences"] for entry in self.source.shards)
        self.starts = np.cumsum([0, *sizes])
        self.layout = ShardLayout(sizes, shards_per_block or default_shards_per_block(sizes, self.seq_len))
        self.capacity = 2 * self.layout.shards_per_block
        """Shard files kept in the cache folder (and maps kept open by each process)."""
        self.fields = {name: ShardedField(self, name) for name in self.source.index["fields"]}
        self._maps: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.source)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_maps": OrderedDict()}  # a DataLoader worker maps the files itself

    @property
    def seq_len(self) -> int:
        return self.source.seq_len

    @property
    def num_tokens(self) -> int:
        return self.source.num_tokens

    def _check_sizes(self) -> None:
        """Every listed shard is a plain file of its listed size, so a missing or truncated one is named before
        step 1: one directory listing per split folder (at 100,000 shards a resolve and stat of each took 45 s)."""
        found: dict[str, int] = {}
        for split in {entry["file"].split("/")[0] for entry in self.source.shards}:
            try:
                with os.scandir(self.source.folder / split) as entries:
                    for entry in entries:
                        if entry.is_file(follow_symlinks=False):
                            found[f"{split}/{entry.name}"] = entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
        for shard, entry in enumerate(self.source.shards):
            if found.get(entry["file"], -1) != entry.get("bytes", found.get(entry["file"])):
                self.source.check_size(shard)  # names what is wrong: missing, a link, or its size

    def shard(self, shard: int) -> dict[str, np.ndarray]:
        """Shard `shard`'s arrays, memory-mapped from the cache (filled from the checked shard if absent)."""
        if shard in self._maps:
            self._maps.move_to_end(shard)
            return self._maps[shard]
        path = self.folder / f"{shard:07d}.raw"
        try:
            with open(path, "rb") as file:
                raw = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raw = self._fill(shard, path)
        arrays = self.source.arrays(shard, raw)
        if set(arrays) != set(self.fields):
            raise PipelineError(f"shard {self.source.folder / self.source.shards[shard]['file']}: holds fields "
                                f"{sorted(arrays)}, index.json lists {sorted(self.fields)}")
        self._maps[shard] = arrays
        while len(self._maps) > self.capacity:
            self._maps.popitem(last=False)
        return arrays

    def _fill(self, shard: int, path: Path) -> mmap.mmap:
        """Check and decompress shard `shard` into the cache; its map (taken before it is published, so another
        process's eviction cannot take it away)."""
        raw = self.source.decompressed(shard)  # the size and sha256 checks: a bad shard is named here
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        with reporting_disk_full(path, len(raw)):
            try:
                with open(tmp, "wb+") as file:
                    file.write(raw)
                    file.flush()
                    mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
                os.replace(tmp, path)  # two processes filling the same shard publish the same bytes
            finally:
                tmp.unlink(missing_ok=True)
        self._evict(keep=path)
        return mapped

    def _evict(self, keep: Path) -> None:
        """Delete the oldest cache files beyond `capacity` (the newest belong to the block being read)."""
        files = []
        for entry in os.scandir(self.folder):
            if entry.name.endswith(".raw") and entry.path != str(keep):
                try:
                    files.append((entry.stat().st_mtime_ns, entry.path))
                except FileNotFoundError:  # another process evicted it meanwhile
                    continue
        for _, old in sorted(files)[: max(0, len(files) + 1 - self.capacity)]:
            Path(old).unlink(missing_ok=True)


class ShardedField:
    """One field of a `TokenCache` as a read-only array: `field[rows]`, `field[i]`, `field[a:b]`, `len`, `shape`."""

    def __init__(self, cache: TokenCache, name: str):
        self.cache, self.name = cache, name

    def __len__(self) -> int:
        return len(self.cache)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.cache), *self.cache.shard(0)[self.name].shape[1:])

    def __getitem__(self, rows: int | slice | np.ndarray) -> np.ndarray:
        cache = self.cache
        if isinstance(rows, slice):
            rows = np.arange(len(cache))[rows]
        single = np.ndim(rows) == 0
        rows = np.atleast_1d(np.asarray(rows, dtype=np.int64))
        if len(rows) and (rows.min() < 0 or rows.max() >= len(cache)):
            raise IndexError(f"rows {rows.min()}..{rows.max()} out of range for {len(cache)} sequences")
        shard_of = np.searchsorted(cache.starts, rows, side="right") - 1
        first = cache.shard(int(shard_of[0]) if len(rows) else 0)[self.name]
        out = np.empty((len(rows), *first.shape[1:]), dtype=first.dtype)
        for shard in np.unique(shard_of):
            mine = shard_of == shard
            out[mine] = cache.shard(int(shard))[self.name][rows[mine] - cache.starts[shard]]
        return out[0] if single else out


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
    """`field[rows]` gathered from each corpus's cache (rows keep their order)."""

    def __init__(self, owner: ConcatenatedCaches, name: str):
        self.owner, self.name = owner, name

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows)
        owner = self.owner
        corpus = owner.corpus_of(rows)
        parts = {int(c): owner.caches[c].fields[self.name][rows[corpus == c] - owner.offsets[c]]
                 for c in np.unique(corpus)}
        first = next(iter(parts.values()))
        out = np.empty((len(rows), *first.shape[1:]), dtype=first.dtype)
        for c, values in parts.items():
            out[corpus == c] = values
        return out
