"""Exact deduplication across all inputs and all ranks: drop a document whose normalised text was seen before.

"Before" is the order of a single-process run: rank 0's records, then rank 1's, and so on, each
in its own input order. So the first copy of a document is kept, wherever it is.

Two passes, the second being the shard stage itself:
1. **Hashes.** Every rank's records are read, decoded and hashed (NFKC, case-folded, whitespace
   collapsed; 64-bit BLAKE2b) into `parts/partNNNNN.hashes.zst`, one hash per record.
2. **Drop list.** Before tokenizing, a rank loads the hashes of the ranks before it and its own,
   and drops each record whose hash occurs earlier. Duplicates are still tokenized, to count the
   tokens dropped, but never packed.

Why a pre-pass and not a drop list at combine time: with FULL-SENTENCES packing a document shares
its sequences with its neighbours, so removing it after the shards are written means re-packing
and rewriting every shard after it. Hashing costs a fraction of tokenizing, and with it every
shard is final when written, so resume and combine work as without deduplication. A rank that
finds another rank's hashes missing computes them itself (the writes are atomic and identical),
so any rank can run first and nothing waits on anything; an array job that hashes all parts
first (`--dedup-hashes-only`) keeps every rank reading only its own piece.

A 64-bit hash confuses two different documents with probability about n^2 / 2^65 (1e-4 for
60 million documents); such a pair would lose its second document.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import write_atomic
from pipeline.data.shards.format import decode, encode
from pipeline.data.shards.index import part_name

NO_TEXT = np.uint64(0)
"""The hash of a record with no usable text (empty, malformed, oversized): never a duplicate."""


def normalised_hash(text: str) -> int:
    """A 64-bit hash of the text after NFKC, case folding and collapsing whitespace (never NO_TEXT)."""
    normal = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    value = int.from_bytes(hashlib.blake2b(normal.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
    return value or 1


def hashes_path(out: Path, rank: int) -> Path:
    return out / "parts" / f"{part_name(rank)}.hashes.zst"


def load_hashes(out: Path, rank: int, key: dict) -> np.ndarray | None:
    """Rank `rank`'s record hashes if they were made for these inputs (`key`), else None."""
    path = hashes_path(out, rank)
    if not path.is_file():
        return None
    try:
        arrays, meta = decode(path.read_bytes(), str(path))
    except Exception:  # unreadable: make it again
        return None
    return arrays["hashes"] if meta.get("key") == key else None


def save_hashes(out: Path, rank: int, key: dict, hashes: np.ndarray) -> None:
    write_atomic(hashes_path(out, rank), encode({"hashes": hashes.astype(np.uint64)}, {"key": key}, level=1))


def all_hashes(out: Path, world_size: int, upto: int, key: dict, compute: Callable[[int], np.ndarray]) -> list:
    """Hashes of ranks 0..upto, loaded, or computed (and saved) where missing or made for other inputs."""
    found = []
    for rank in range(upto + 1):
        hashes = load_hashes(out, rank, key)
        if hashes is None:
            hashes = compute(rank)
            save_hashes(out, rank, key, hashes)
        found.append(hashes)
    return found


def drop_mask(hashes: list[np.ndarray]) -> np.ndarray:
    """For the last rank's records: True where the same text occurs earlier (earlier ranks, or earlier in it)."""
    mine = hashes[-1]
    earlier = np.concatenate(hashes[:-1]) if len(hashes) > 1 else np.zeros(0, np.uint64)
    seen_before = np.isin(mine, earlier)
    first = np.zeros(len(mine), bool)
    first[np.unique(mine, return_index=True)[1]] = True
    return (mine != NO_TEXT) & (seen_before | ~first)
