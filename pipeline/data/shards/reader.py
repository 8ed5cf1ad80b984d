"""Random access to the sequences of a shard folder, for training and evaluation.

`ShardedDataset(folder, split)[i]` returns sequence `i` as a dict of numpy arrays. Shards are
decompressed whole on first use (one zstd call, then zero-copy views) and the last few are kept
in an LRU cache, so reads in shard order cost one decompression per shard. Each shard's sha256
is checked when it is loaded, so a corrupt or truncated shard stops the reader with an error
naming the file instead of feeding garbage to training.
"""

from __future__ import annotations

import bisect
import mmap
from collections import OrderedDict
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import sha256_bytes
from pipeline.common.errors import PipelineError
from pipeline.data.shards.format import ShardFormatError, decompress_bounded, parse
from pipeline.data.shards.index import SPLITS, load_index, shard_byte_bound, shard_path


class ShardedDataset:
    """Sequences of one split of a shard folder, checked against the expected tokenizer and length."""

    def __init__(
        self,
        folder: str | Path,
        split: str = "train",
        *,
        seq_len: int | None = None,
        tokenizer_fingerprint: str | None = None,
        cache_shards: int = 4,
    ):
        if split not in SPLITS:
            raise PipelineError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
        self.folder = Path(folder)
        self.index = load_index(self.folder)
        problems = []
        if seq_len is not None and self.index["seq_len"] != seq_len:
            problems.append(f"sequence length is {self.index['seq_len']}, the run expects {seq_len}")
        fingerprint = self.index["tokenizer"]["fingerprint"]
        if tokenizer_fingerprint is not None and fingerprint != tokenizer_fingerprint:
            problems.append(f"tokenizer fingerprint is {fingerprint[:19]}…, the run's tokenizer has "
                            f"{tokenizer_fingerprint[:19]}… (the shards were made with another tokenizer)")
        if problems:
            raise PipelineError(f"shard folder {self.folder} does not match: " + "; ".join(problems)
                                + ". Re-run data_prep/shard.py with the run's tokenizer and seq_len.")
        self.split = split
        self.shards = self.index["splits"][split]["shards"]
        self.seq_len: int = self.index["seq_len"]
        self.pack: str = self.index["pack"]
        self._starts = np.cumsum([0] + [s["sequences"] for s in self.shards]).tolist()
        self._cache: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()
        self._cache_shards = max(1, cache_shards)

    def __len__(self) -> int:
        return self._starts[-1]

    @property
    def num_tokens(self) -> int:
        return self.index["splits"][self.split]["tokens"]

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"sequence {i} out of range for {len(self)} sequences")
        shard = bisect.bisect_right(self._starts, i) - 1
        arrays = self._load(shard)
        row = i - self._starts[shard]
        return {name: values[row] for name, values in arrays.items()}

    def _load(self, shard: int) -> dict[str, np.ndarray]:
        if shard in self._cache:
            self._cache.move_to_end(shard)
            return self._cache[shard]
        arrays = self.arrays(shard, self.decompressed(shard))
        self._cache[shard] = arrays
        if len(self._cache) > self._cache_shards:
            self._cache.popitem(last=False)
        return arrays

    def check_size(self, shard: int) -> Path:
        """Shard `shard`'s file, once it is there with the size index.json lists (a stat: no byte is read)."""
        entry = self.shards[shard]
        path = shard_path(self.folder, entry["file"])
        try:
            size = path.stat().st_size
        except OSError:
            raise PipelineError(f"shard {path} is missing (listed in index.json); run "
                                f"data_prep/verify_shards.py {self.folder}") from None
        if "bytes" in entry and size != entry["bytes"]:  # checked before reading: a huge file is not read
            raise PipelineError(f"shard {path} is corrupt or truncated: {size:,} bytes, index.json says "
                                f"{entry['bytes']:,} (run data_prep/verify_shards.py {self.folder})")
        return path

    def decompressed(self, shard: int) -> bytes:
        """Shard `shard`'s container bytes, once its size and sha256 match index.json (decompression bounded
        by its counts)."""
        entry = self.shards[shard]
        path = self.check_size(shard)
        try:
            data = path.read_bytes()
        except OSError as err:
            raise PipelineError(f"shard {path}: cannot read: {err.strerror or err}") from None
        if sha256_bytes(data) != entry["sha256"]:
            raise PipelineError(f"shard {path} is corrupt or truncated: its sha256 does not match "
                                f"index.json (run data_prep/verify_shards.py {self.folder})")
        try:
            return decompress_bounded(data, str(path), shard_byte_bound(entry, self.seq_len, self.index.get("fields")))
        except ShardFormatError as err:
            raise PipelineError(str(err)) from None

    def arrays(self, shard: int, raw: bytes | mmap.mmap) -> dict[str, np.ndarray]:
        """Shard `shard`'s arrays from its decompressed bytes (or a memory map of them), their shapes checked
        against index.json."""
        entry = self.shards[shard]
        path = self.folder / entry["file"]
        try:
            arrays, _ = parse(raw, str(path))
        except ShardFormatError as err:
            raise PipelineError(str(err)) from None
        ids = arrays.get("input_ids")
        if ids is None or ids.ndim != 2 or ids.shape[1] != self.seq_len:
            raise PipelineError(f"shard {path}: input_ids should be ({entry['sequences']}, {self.seq_len}), "
                                f"got {None if ids is None else ids.shape}")
        if any(len(values) != len(ids) for values in arrays.values()):
            raise PipelineError(f"shard {path}: its fields hold different numbers of rows")
        if len(arrays["input_ids"]) != entry["sequences"]:
            raise PipelineError(f"shard {path}: holds {len(arrays['input_ids'])} sequences, "
                                f"index.json says {entry['sequences']}")
        return arrays
