"""Resume snapshots of the shard stage: the input position plus the packers' and writers' state.

The packers' state includes their open documents' origins, and the writers' pending sequences
carry theirs, so a resumed part writes the same origins files as an uninterrupted one.

Saved after every record batch that completed a shard, so a killed run loses at most the shard in
progress; restored only when every shard it lists still verifies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import write_atomic
from pipeline.data.packers import Packer
from pipeline.data.shards.format import decode, encode
from pipeline.data.shards.index import SPLITS, check_shard, part_name, resume_path
from pipeline.data.shards.options import changed_keys
from pipeline.data.shards.writer import ShardWriter


@dataclass
class StageState:
    """Everything that changes while a part is written; what a resume snapshot restores."""

    position: int = 0
    """Index of the next record batch of this rank's input pieces to read."""
    counts: Counter = field(default_factory=Counter)
    """Skipped or repaired records by reason."""
    examples: list[str] = field(default_factory=list)
    """Messages naming skipped records, for the summary."""
    seconds: float = 0.0
    """Time spent on this part by earlier, interrupted runs, in seconds."""


def save_snapshot(out: Path, rank: int, identity: dict, state: StageState, packers: dict[str, Packer],
                  writers: dict[str, ShardWriter], seconds: float) -> None:
    arrays: dict[str, np.ndarray] = {}
    meta: dict = {"identity": identity, "position": state.position, "counts": dict(state.counts),
                  "examples": state.examples, "seconds": seconds, "packers": {}, "shards": {}, "origins": True}
    for split in SPLITS:
        scalars, packer_arrays = packers[split].state()
        meta["packers"][split] = scalars
        arrays.update({f"{split}/packer/{k}": v for k, v in packer_arrays.items()})
        shards, pending = writers[split].state()
        meta["shards"][split] = shards
        arrays.update({f"{split}/pending/{k}": v for k, v in pending.items()})
    write_atomic(resume_path(out, rank), encode(arrays, meta, level=1))


def restore_snapshot(out: Path, rank: int, identity: dict, packers: dict[str, Packer],
                     writers: dict[str, ShardWriter], say: Callable[[str], None]) -> StageState:
    """Restore the newest snapshot if its shards verify; otherwise start this part afresh."""
    path = resume_path(out, rank)
    if not path.is_file():
        return StageState()
    try:
        arrays, meta = decode(path.read_bytes(), str(path))
    except Exception as err:
        say(f"resume snapshot unreadable ({err}); starting {part_name(rank)} afresh")
        return StageState()
    if changed_keys(meta["identity"], identity):
        return StageState()
    if not meta.get("origins"):
        say(f"the resume snapshot predates document origins; starting {part_name(rank)} afresh")
        return StageState()
    for split in SPLITS:
        for shard in meta["shards"][split]:
            if problem := check_shard(out, shard, identity["seq_len"], packers[split].dtype.name):
                say(f"{problem}; starting {part_name(rank)} afresh")
                return StageState()
    for split in SPLITS:
        prefix = f"{split}/packer/"
        packers[split].load_state(meta["packers"][split],
                                  {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})
        prefix = f"{split}/pending/"
        writers[split].load_state(meta["shards"][split],
                                  {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})
    done = sum(len(meta["shards"][s]) for s in SPLITS)
    say(f"resuming {part_name(rank)}: {done} shards verified, carrying on from record batch {meta['position']}")
    return StageState(meta["position"], Counter(meta["counts"]), meta["examples"], meta["seconds"])
