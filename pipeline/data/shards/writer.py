"""Sequences of one split → shard files of exactly `shard_size` sequences (the last may be short), each with its
documents' origins beside it (`pipeline.data.shards.origins`) when the sequences carry them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import sha256_bytes, write_atomic
from pipeline.data.packers import DOCUMENT_COUNTS, DOCUMENT_KEYS, Sequences, take_rows
from pipeline.data.shards.format import encode
from pipeline.data.shards.index import part_name
from pipeline.data.shards.origins import encode_origins


class ShardWriter:
    """Collects sequences of one split and writes them in shards of exactly `shard_size` (the last may be short)."""

    def __init__(self, out: Path, split: str, rank: int, shard_size: int, meta: dict, level: int):
        self.out, self.split, self.rank = out, split, rank
        self.shard_size, self.meta, self.level = shard_size, meta, level
        self.pending: list[Sequences] = []
        self.pending_rows = 0
        self.shards: list[dict] = []

    def add(self, seqs: Sequences) -> bool:
        """Queue sequences; write every full shard. True if a shard was written."""
        n = len(seqs["input_ids"])
        if n:
            self.pending.append(seqs)
            self.pending_rows += n
        wrote = False
        while self.pending_rows >= self.shard_size:
            shard, rest = take_rows(self._take_all(), self.shard_size)
            self._write(shard)
            if len(rest["input_ids"]):
                self.pending, self.pending_rows = [rest], len(rest["input_ids"])
            wrote = True
        return wrote

    def close(self) -> None:
        if self.pending_rows:
            self._write(self._take_all())

    def _take_all(self) -> Sequences:
        merged = {k: np.concatenate([p[k] for p in self.pending]) for k in self.pending[0]}
        self.pending, self.pending_rows = [], 0
        return merged

    def _write(self, seqs: Sequences) -> None:
        stem = f"{self.split}/{part_name(self.rank)}-shard{len(self.shards):06d}"
        counts, keys = seqs.pop(DOCUMENT_COUNTS, None), seqs.pop(DOCUMENT_KEYS, None)
        data = encode(seqs, {**self.meta, "split": self.split}, self.level)
        write_atomic(self.out / f"{stem}.zst", data)
        tokens = int(seqs["length"].sum()) if "length" in seqs else seqs["input_ids"].size
        entry = {"file": f"{stem}.zst", "sequences": len(seqs["input_ids"]), "tokens": tokens,
                 "bytes": len(data), "sha256": sha256_bytes(data)}
        if counts is not None:
            origins = encode_origins(counts, keys)
            write_atomic(self.out / f"{stem}.origins.zst", origins)
            entry["origins"] = {"file": f"{stem}.origins.zst", "part": self.rank, "bytes": len(origins),
                                "sha256": sha256_bytes(origins)}
        self.shards.append(entry)

    def state(self) -> tuple[list[dict], dict[str, np.ndarray]]:
        """The shards written so far and the sequences not yet in a shard (for a resume snapshot)."""
        pending = {k: np.concatenate([p[k] for p in self.pending]) for k in self.pending[0]} if self.pending else {}
        return self.shards, pending

    def load_state(self, shards: list[dict], pending: dict[str, np.ndarray]) -> None:
        self.shards = list(shards)
        self.pending = [dict(pending)] if pending and len(pending["input_ids"]) else []
        self.pending_rows = len(pending["input_ids"]) if self.pending else 0
