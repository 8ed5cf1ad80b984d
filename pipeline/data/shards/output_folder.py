"""The shard stage's output-folder policy: never mix runs, overwrite only our own files, trust only verified parts."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.common.errors import PipelineError
from pipeline.data.shards.format import decode
from pipeline.data.shards.index import (
    INDEX_NAME,
    SPLITS,
    check_shard,
    part_name,
    part_summary_path,
    read_json,
    resume_path,
)
from pipeline.data.shards.options import changed_keys


def prepare_output(out: Path, identity: dict, *, rank: int, world_size: int, overwrite: bool) -> Path:
    """Create or check the output folder; refuse to mix runs with different arguments."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        for split in (*SPLITS, "parts"):
            (out / split).mkdir(exist_ok=True)
        probe = out / "parts" / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise PipelineError(f"output folder {out} cannot be written: {err.strerror or err}") from None

    previous = previous_identity(out, rank)
    foreign = [p.name for p in out.iterdir() if p.name not in (*SPLITS, "parts", INDEX_NAME)]
    if previous is None and foreign and not overwrite:
        raise PipelineError(f"output folder {out} is not empty and holds no shard index "
                            f"({', '.join(sorted(foreign)[:3])} ...); choose another --out or pass --overwrite")
    changed = None if previous is None else changed_keys(previous, identity)
    if changed:
        if not overwrite:
            raise PipelineError(
                f"output folder {out} holds shards made with different arguments (changed: "
                f"{', '.join(changed)}); pass --overwrite to replace them, or choose another --out")
    if overwrite and changed:
        remove_outputs(out, rank, world_size)
    return out


def previous_identity(out: Path, rank: int) -> dict | None:
    """The arguments that made what is already in `out`, if anything."""
    if (out / INDEX_NAME).is_file():
        return read_json(out / INDEX_NAME).get("args")
    for path in (part_summary_path(out, rank), *sorted((out / "parts").glob("part*.json"))):
        if path.is_file():
            return read_json(path).get("identity")
    snapshot = resume_path(out, rank)
    if snapshot.is_file():
        try:
            return decode(snapshot.read_bytes(), str(snapshot))[1]["identity"]
        except Exception:
            return {"unreadable resume snapshot": str(snapshot)}
    return None


def remove_outputs(out: Path, rank: int, world_size: int) -> None:
    """Delete this run's own files only (the whole shard set when world_size is 1), never foreign ones."""
    (out / INDEX_NAME).unlink(missing_ok=True)
    pattern = "*" if world_size == 1 else f"{part_name(rank)}*"
    for folder in (*SPLITS, "parts"):
        for path in (out / folder).glob(pattern):
            path.unlink()


def completed_part(out: Path, rank: int, identity: dict) -> dict | None:
    """This rank's summary if the part is complete, made with `identity`, and every shard verifies."""
    path = part_summary_path(out, rank)
    if not path.is_file():
        return None
    summary = read_json(path)
    if summary.get("identity") is None or changed_keys(summary["identity"], identity) or not summary.get("complete"):
        return None
    for shards in summary["shards"].values():
        for shard in shards:
            if check_shard(out, shard, identity["seq_len"], summary["dtype"]) is not None:
                path.unlink()  # redo this part; until then no index may list its bad shard
                (out / INDEX_NAME).unlink(missing_ok=True)
                return None
    return summary
