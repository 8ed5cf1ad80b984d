"""`index.json`: the commit record of a shard folder, and the checks that trust nothing else.

Layout of a folder made by `data_prep/shard.py`:

    index.json                          written last; readers trust only the shards it lists
    train/part00000-shard000000.zst     training shards of part (rank) 0
    train/part00000-shard000000.origins.zst  which documents each of its sequences holds
    val/part00000-shard000000.zst       validation shards (and their .origins.zst)
    parts/part00000.json                per-part summary and stats, once that part is complete
    parts/part00000.resume.zst          resume snapshot while that part is in progress

An index is read as untrusted input: every shard name must be `train/…zst` or `val/…zst` inside the
folder (no `..`, absolute path or symlink out), every count must be a plausible integer that adds
up, and the bytes a shard may decompress to are bounded by its own counts (`shard_byte_bound`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import sha256_file, write_json_atomic
from pipeline.common.config.size_limits import MAX_GLOBAL_BATCH, MAX_JSON_FILE_BYTES, MAX_SEQ_LEN, MAX_SHARD_BYTES
from pipeline.common.errors import PipelineError
from pipeline.data.shards.format import FORMAT_VERSION, ShardFormatError, decode

INDEX_NAME = "index.json"
SPLITS = ("train", "val")
SKIP_REASONS = ("empty", "oversized", "bad_record", "invalid_utf8")


def part_name(rank: int) -> str:
    return f"part{rank:05d}"


def part_summary_path(out: Path, rank: int) -> Path:
    return out / "parts" / f"{part_name(rank)}.json"


def resume_path(out: Path, rank: int) -> Path:
    return out / "parts" / f"{part_name(rank)}.resume.zst"


SHARD_NAME = re.compile(r"^(train|val)/[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.zst$")
ORIGINS_SUFFIX = ".origins.zst"
DTYPES = ("uint8", "uint16", "int16", "uint32", "int32", "int64")
MAX_SHARDS = 1 << 20
HEADER_BYTES = 1 << 20
"""Room for a shard's container header (JSON) on top of its arrays, in `shard_byte_bound`."""


def read_json(path: Path) -> dict:
    try:
        size = path.stat().st_size
        if size > MAX_JSON_FILE_BYTES:
            raise PipelineError(f"{path}: {size:,} bytes, more than the {MAX_JSON_FILE_BYTES:,} a JSON file of a "
                                "shard folder may have")
        value = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise PipelineError(f"{path}: cannot read it as JSON: {str(err)[:200]}") from None
    if not isinstance(value, dict):
        raise PipelineError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def shard_byte_bound(shard: dict, seq_len: int, fields: list | None) -> int:
    """The most bytes a listed shard may decompress to: its rows × fields × (seq_len + 1) × 8, plus a header."""
    return shard["sequences"] * max(len(fields or ()), 4) * (seq_len + 1) * 8 + HEADER_BYTES


def shard_path(folder: Path, name: str) -> Path:
    """The file of a listed shard, refusing one that resolves outside `folder` (a symlink out)."""
    path = folder / name
    root = folder.resolve()
    if not path.resolve().is_relative_to(root) or path.is_symlink():
        raise PipelineError(f"{folder / INDEX_NAME}: shard {name!r} is a link or leads outside {folder}; "
                            "shards must be plain files inside the folder")
    return path


def _is_count(value, limit: int) -> bool:
    return type(value) is int and 0 <= value <= limit


def index_problems(index, path: Path) -> list[str]:
    """Everything implausible in an index: types, names that leave the folder, counts that are absurd or
    do not add up. An index is read before any shard, so nothing is allocated from it unchecked."""
    if not isinstance(index, dict):
        return [f"expected a JSON object, got {type(index).__name__}"]
    problems = []
    seq_len, dtype = index.get("seq_len"), index.get("dtype")
    if not _is_count(seq_len, MAX_SEQ_LEN) or seq_len < 1:
        problems.append(f"seq_len {seq_len!r}: expected an integer from 1 to {MAX_SEQ_LEN:,}")
        seq_len = None
    if dtype not in DTYPES:
        problems.append(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if not isinstance(index.get("pack"), str):
        problems.append(f"pack {index.get('pack')!r}: expected a string")
    fields = index.get("fields", [])
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields) or len(fields) > 64:
        problems.append("fields: expected a short list of field names")
        fields = []
    tokenizer = index.get("tokenizer")
    if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("fingerprint"), str):
        problems.append("tokenizer: expected an object with a fingerprint string")
    for key in ("totals", "args"):
        if not isinstance(index.get(key, {}), dict):
            problems.append(f"{key}: expected an object")
    splits = index.get("splits")
    if not isinstance(splits, dict) or any(not isinstance(splits.get(split), dict) for split in SPLITS):
        return problems + [f"splits: expected an object with {' and '.join(SPLITS)} objects"]
    names = set()
    for split in SPLITS:
        entry, where = splits[split], f"splits.{split}"
        shards = entry.get("shards")
        if not isinstance(shards, list) or len(shards) > MAX_SHARDS:
            problems.append(f"{where}.shards: expected a list of at most {MAX_SHARDS:,} shards")
            continue
        total_sequences = total_tokens = 0
        for i, shard in enumerate(shards):
            at = f"{where}.shards[{i}]"
            if not isinstance(shard, dict):
                problems.append(f"{at}: expected an object")
                continue
            name = shard.get("file")
            if not isinstance(name, str) or not SHARD_NAME.match(name) or not name.startswith(split + "/"):
                problems.append(f"{at}.file {str(name)[:100]!r}: expected '{split}/NAME.zst' inside the folder "
                                "(no '..', no absolute path)")
            elif name in names:
                problems.append(f"{at}.file {name!r}: listed twice")
            else:
                names.add(name)
            sequences, tokens = shard.get("sequences"), shard.get("tokens")
            if not _is_count(sequences, MAX_GLOBAL_BATCH):
                problems.append(f"{at}.sequences {sequences!r}: expected an integer from 0 to {MAX_GLOBAL_BATCH:,}")
                continue
            if seq_len and not _is_count(tokens, sequences * seq_len):
                problems.append(f"{at}.tokens {tokens!r}: expected an integer from 0 to sequences × seq_len "
                                f"({sequences * seq_len:,})")
                continue
            if seq_len and shard_byte_bound(shard, seq_len, fields) > MAX_SHARD_BYTES:
                problems.append(f"{at}: {sequences:,} sequences of {seq_len:,} tokens would decompress past the "
                                f"{MAX_SHARD_BYTES:,}-byte bound of one shard")
            problems += _file_entry_problems(shard, at)
            if "origins" in shard:
                problems += _origins_entry_problems(shard["origins"], f"{at}.origins", split, names)
            total_sequences += sequences
            total_tokens += tokens if type(tokens) is int else 0
        if entry.get("sequences") != total_sequences or entry.get("tokens") != total_tokens:
            problems.append(f"{where}: sequences {entry.get('sequences')!r} and tokens {entry.get('tokens')!r} "
                            f"should be the shards' sums, {total_sequences} and {total_tokens}")
    return problems + _origins_problems(index.get("origins"), splits)


def _file_entry_problems(entry: dict, at: str) -> list[str]:
    problems = []
    if not _is_count(entry.get("bytes", 0), MAX_SHARD_BYTES):
        problems.append(f"{at}.bytes {entry.get('bytes')!r}: expected an integer from 0 to {MAX_SHARD_BYTES:,}")
    digest = entry.get("sha256")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        problems.append(f"{at}.sha256: expected 64 hexadecimal digits")
    return problems


def _origins_entry_problems(entry, at: str, split: str, names: set) -> list[str]:
    """A shard's origins file: a name beside the shard's, its size, checksum and part."""
    if not isinstance(entry, dict):
        return [f"{at}: expected an object"]
    problems = []
    name = entry.get("file")
    if not isinstance(name, str) or not SHARD_NAME.match(name) or not name.startswith(split + "/") \
            or not name.endswith(ORIGINS_SUFFIX):
        problems.append(f"{at}.file {str(name)[:100]!r}: expected '{split}/NAME{ORIGINS_SUFFIX}' inside the folder")
    elif name in names:
        problems.append(f"{at}.file {name!r}: listed twice")
    else:
        names.add(name)
    if "bytes" not in entry:
        problems.append(f"{at}.bytes: missing")
    if not _is_count(entry.get("part"), MAX_SHARDS):
        problems.append(f"{at}.part {entry.get('part')!r}: expected a part number")
    return problems + _file_entry_problems(entry, at)


def _origins_problems(origins, splits: dict) -> list[str]:
    """index.json's `origins`: the input files, named once, and each part's line offsets."""
    if origins is None:
        return []
    files, offsets = (origins.get("files"), origins.get("line_offsets")) if isinstance(origins, dict) else (0, 0)
    if not isinstance(files, list) or len(files) > MAX_SHARDS or not all(isinstance(f, str) for f in files):
        return [f"origins.files: expected a list of at most {MAX_SHARDS:,} file names"]
    if not isinstance(offsets, list) or len(offsets) > MAX_SHARDS or not all(
            isinstance(part, list) and all(isinstance(pair, list) and len(pair) == 2
                                           and _is_count(pair[0], len(files) - 1) and _is_count(pair[1], 1 << 40)
                                           for pair in part) for part in offsets):
        return ["origins.line_offsets: expected, per part, a list of [file number, lines before its piece]"]
    parts = [s["origins"].get("part") for split in SPLITS for s in splits[split].get("shards", [])
             if isinstance(s, dict) and isinstance(s.get("origins"), dict)]
    if beyond := [part for part in parts if type(part) is int and part >= len(offsets)]:
        return [f"origins.line_offsets: holds {len(offsets)} parts, a shard's origins name part {beyond[0]}"]
    return []


def load_index(folder: str | Path) -> dict:
    """Read and sanity-check `index.json`; a folder without one has no committed shards."""
    folder = Path(folder)
    path = folder / INDEX_NAME
    if not folder.is_dir():
        raise PipelineError(f"shard folder {folder} does not exist")
    if not path.is_file():
        raise PipelineError(f"{folder} has no {INDEX_NAME}: the shard stage did not finish there "
                            "(rerun data_prep/shard.py with the same arguments to complete it)")
    if path.is_symlink() or not path.resolve().is_relative_to(folder.resolve()):
        raise PipelineError(f"{path}: is a link; a shard folder's {INDEX_NAME} must be a plain file inside it")
    index = read_json(path)
    version = index.get("format_version") if isinstance(index, dict) else None
    if version != FORMAT_VERSION:
        raise PipelineError(f"{path}: format_version {version!r} is not the supported version {FORMAT_VERSION}")
    if problems := index_problems(index, path):
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise PipelineError(f"{path} is corrupt or was not written by data_prep/shard.py: {shown}")
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
    files = [p["origin_files"] for p in parts if "origin_files" in p]  # parts made before origins have none
    if any(f != files[0] for f in files):
        raise PipelineError(f"{out}: the parts read different input files (a glob or folder changed between "
                            "ranks); rerun every rank with --overwrite")
    if len(files) == len(parts):
        index["origins"] = {"files": files[0], "line_offsets": _line_offsets(parts)}
    write_json_atomic(out / INDEX_NAME, index)
    return index


def _line_offsets(parts: list[dict]) -> list[list[list[int]]]:
    """Per part, [file number, lines before its byte range] for each byte range it read past another's.

    A rank reading a byte range counts lines from the range's first line (it never reads what comes
    before); the ranges of one file go to ranks in order, so the lines before rank R's range are the
    lines the ranks before it counted in theirs.
    """
    counted: dict[int, int] = {}
    offsets = []
    for part in sorted(parts, key=lambda p: p["rank"]):
        mine = [piece for piece in part["inputs"] if piece["kind"] == "bytes"]
        offsets.append([[piece["file"], counted[piece["file"]]] for piece in mine if counted.get(piece["file"])])
        for piece in mine:
            counted[piece["file"]] = counted.get(piece["file"], 0) + piece["lines"]
    return offsets


def check_shard(folder: Path, shard: dict, seq_len: int, dtype: str, fields: list | None = None) -> str | None:
    """Check one listed shard's checksum, container and counts, and its origins file's checksum; return a
    problem, or None."""
    if problem := _listed_file_problem(folder, shard):
        return problem
    path = folder / shard["file"]
    try:
        arrays, _ = decode(path.read_bytes(), str(path), shard_byte_bound(shard, seq_len, fields))
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
    return _listed_file_problem(folder, shard["origins"]) if "origins" in shard else None


def _listed_file_problem(folder: Path, entry: dict) -> str | None:
    """A listed file (a shard or its origins) that is missing, outside the folder, or not the bytes listed."""
    try:
        path = shard_path(folder, entry["file"])
    except PipelineError as err:
        return str(err)
    if not path.is_file():
        return f"{path}: missing"
    if path.stat().st_size != entry.get("bytes", path.stat().st_size):
        return f"{path}: size {path.stat().st_size} bytes, index says {entry['bytes']} (truncated?)"
    if sha256_file(path) != entry["sha256"]:
        return f"{path}: sha256 does not match the index (the file is corrupt or was changed)"
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
            listed.add(shard.get("origins", {}).get("file"))
            if problem := check_shard(folder, shard, index["seq_len"], index["dtype"], index.get("fields")):
                problems.append(problem)
        if entry.get("sequences") != sum(s["sequences"] for s in entry["shards"]):
            problems.append(f"{folder / INDEX_NAME}: {split} sequence total does not add up")
    for split in SPLITS:
        for path in sorted((folder / split).glob("*.zst")):
            if f"{split}/{path.name}" not in listed:
                problems.append(f"{path}: {'origins' if path.name.endswith(ORIGINS_SUFFIX) else 'shard'} file not "
                                f"listed in {INDEX_NAME}")
    return problems
