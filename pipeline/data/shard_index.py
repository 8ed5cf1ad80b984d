"""`index.json`: the commit record of a shard folder, and the checks that trust nothing else.

Layout of a folder made by `data_prep/shard.py`:

    index.json                          written last; readers trust only the shards it lists
    train/part00000-shard000000.zst     training shards of part (rank) 0
    val/part00000-shard000000.zst       validation shards
    parts/part00000.json                per-part summary and stats, once that part is complete
    parts/part00000.resume.zst          resume snapshot while that part is in progress
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import sha256_file, write_json_atomic
from pipeline.common.errors import PipelineError
from pipeline.data.shard_format import FORMAT_VERSION, ShardFormatError, decode

INDEX_NAME = "index.json"
SPLITS = ("train", "val")
SKIP_REASONS = ("empty", "oversized", "bad_record", "invalid_utf8")


def part_name(rank: int) -> str:
    return f"part{rank:05d}"


def part_summary_path(out: Path, rank: int) -> Path:
    return out / "parts" / f"{part_name(rank)}.json"


def resume_path(out: Path, rank: int) -> Path:
    return out / "parts" / f"{part_name(rank)}.resume.zst"


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise PipelineError(f"{path}: cannot read it as JSON: {err}") from None


def load_index(folder: str | Path) -> dict:
    """Read and sanity-check `index.json`; a folder without one has no committed shards."""
    folder = Path(folder)
    path = folder / INDEX_NAME
    if not folder.is_dir():
        raise PipelineError(f"shard folder {folder} does not exist")
    if not path.is_file():
        raise PipelineError(f"{folder} has no {INDEX_NAME}: the shard stage did not finish there "
                            "(rerun data_prep/shard.py with the same arguments to complete it)")
    index = read_json(path)
    if index.get("format_version") != FORMAT_VERSION:
        raise PipelineError(f"{path}: format_version {index.get('format_version')!r} is not the "
                            f"supported version {FORMAT_VERSION}")
    return index


def combine_parts(out: Path, world_size: int) -> dict | None:
    """Merge the complete per-part summaries into `index.json`; None while a part is unfinished.

    Every rank calls this when it finishes; whichever sees all parts complete writes the index.
    Writes are atomic and the content is a pure function of the parts, so two ranks racing to
    write it write the same bytes.
    """
    parts = []
    for rank in range(world_size):
        path = part_summary_path(out, rank)
        if not path.is_file():
            return None
        parts.append(read_json(path))
    identity = parts[0]["identity"]
    for part in parts[1:]:
        if part["identity"] != identity:
            raise PipelineError(f"{out}: the parts were made with different arguments; rerun the "
                                "mismatched ranks with the same arguments, or use --overwrite everywhere")
    splits = {}
    for split in SPLITS:
        shards = [shard for part in parts for shard in part["shards"][split]]
        splits[split] = {"shards": shards, "sequences": sum(s["sequences"] for s in shards),
                         "tokens": sum(s["tokens"] for s in shards)}
    totals: dict = {}
    for part in parts:
        for key, value in part["stats"].items():
            if isinstance(value, dict):
                bucket = totals.setdefault(key, {})
                for k, v in value.items():
                    bucket[k] = bucket.get(k, 0) + v
            else:
                totals[key] = totals.get(key, 0) + value
    slots = totals.get("sequences", 0) * identity["seq_len"]
    totals["padding_fraction"] = totals.get("padding_tokens", 0) / slots if slots else 0.0
    first = parts[0]
    index = {
        "format_version": FORMAT_VERSION,
        "seq_len": identity["seq_len"],
        "pack": identity["pack"],
        "dtype": first["dtype"],
        "fields": first["fields"],
        "tokenizer": first["tokenizer"],
        "splits": splits,
        "totals": totals,
        "args": identity,
        "parts": [{"rank": p["rank"], "seconds": p["seconds"], "input_bytes_read": p.get("input_bytes_read"),
                   "stats": p["stats"], "examples": p["examples"]} for p in parts],
    }
    write_json_atomic(out / INDEX_NAME, index)
    return index


def check_shard(folder: Path, shard: dict, seq_len: int, dtype: str) -> str | None:
    """Check one listed shard's checksum, container and counts; return a problem, or None."""
    path = folder / shard["file"]
    if not path.is_file():
        return f"{path}: missing"
    if path.stat().st_size != shard.get("bytes", path.stat().st_size):
        return f"{path}: size {path.stat().st_size} bytes, index says {shard['bytes']} (truncated?)"
    if sha256_file(path) != shard["sha256"]:
        return f"{path}: sha256 does not match the index (the file is corrupt or was changed)"
    try:
        arrays, _ = decode(path.read_bytes(), str(path))
    except ShardFormatError as err:
        return str(err)
    ids = arrays.get("input_ids")
    if ids is None or ids.ndim != 2 or ids.shape[1] != seq_len or ids.dtype != np.dtype(dtype):
        return f"{path}: input_ids should be ({shard['sequences']}, {seq_len}) {dtype}"
    if len(ids) != shard["sequences"]:
        return f"{path}: holds {len(ids)} sequences, index says {shard['sequences']}"
    tokens = int(arrays["length"].sum()) if "length" in arrays else ids.size
    if tokens != shard["tokens"]:
        return f"{path}: holds {tokens} tokens, index says {shard['tokens']}"
    return None


def verify_folder(folder: str | Path) -> list[str]:
    """Every problem with a shard folder: index, checksums, counts, unlisted shard files."""
    folder = Path(folder)
    try:
        index = load_index(folder)
    except PipelineError as err:
        return [str(err)]
    problems = []
    listed = set()
    for split in SPLITS:
        entry = index["splits"].get(split, {"shards": []})
        for shard in entry["shards"]:
            listed.add(shard["file"])
            if problem := check_shard(folder, shard, index["seq_len"], index["dtype"]):
                problems.append(problem)
        if entry.get("sequences") != sum(s["sequences"] for s in entry["shards"]):
            problems.append(f"{folder / INDEX_NAME}: {split} sequence total does not add up")
    for split in SPLITS:
        for path in sorted((folder / split).glob("*.zst")):
            if f"{split}/{path.name}" not in listed:
                problems.append(f"{path}: shard file not listed in {INDEX_NAME}")
    return problems
