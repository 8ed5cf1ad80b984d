"""The shard file format.

A shard is one zstd frame holding a small container:

    b"RPSHARD1" | uint32 little-endian header length | header (JSON) | array bytes, sorted by field name

The header maps each field name to its dtype and shape, and may carry extra JSON metadata. Arrays
are C-ordered and read back as zero-copy views of the decompressed buffer. The same container
holds the shard stage's resume snapshots. Compression runs single-threaded at a fixed level, so
the same arrays always give the same bytes.
"""

from __future__ import annotations

import json
import struct

import numpy as np

MAGIC = b"RPSHARD1"
FORMAT_VERSION = 1
DEFAULT_LEVEL = 3


class ShardFormatError(ValueError):
    """The bytes are not a valid shard container."""


def encode(arrays: dict[str, np.ndarray], meta: dict | None = None, level: int = DEFAULT_LEVEL) -> bytes:
    """Serialise named arrays (and optional JSON metadata) into compressed container bytes."""
    import zstandard

    names = sorted(arrays)  # the header is written with sorted keys, so the data must follow that order
    fields = {name: {"dtype": arrays[name].dtype.str, "shape": list(arrays[name].shape)} for name in names}
    header = json.dumps({"version": FORMAT_VERSION, "fields": fields, "meta": meta or {}},
                        sort_keys=True).encode()
    parts = [MAGIC, struct.pack("<I", len(header)), header]
    parts += [np.ascontiguousarray(arrays[name]).tobytes() for name in names]
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(b"".join(parts))


def decode(data: bytes, name: str = "shard") -> tuple[dict[str, np.ndarray], dict]:
    """Inverse of `encode`; raises `ShardFormatError` naming `name` on any inconsistency."""
    import zstandard

    try:
        raw = zstandard.ZstdDecompressor().decompress(data)
    except zstandard.ZstdError as err:
        raise ShardFormatError(f"{name}: cannot decompress ({err}); the file is corrupt or truncated") from None
    if raw[: len(MAGIC)] != MAGIC:
        raise ShardFormatError(f"{name}: not a shard file (bad magic bytes)")
    (header_len,) = struct.unpack_from("<I", raw, len(MAGIC))
    offset = len(MAGIC) + 4
    try:
        header = json.loads(raw[offset: offset + header_len])
    except ValueError:
        raise ShardFormatError(f"{name}: the header is not valid JSON") from None
    offset += header_len
    arrays = {}
    for field, spec in header["fields"].items():
        dtype = np.dtype(spec["dtype"])
        count = int(np.prod(spec["shape"], dtype=np.int64))
        nbytes = count * dtype.itemsize
        if offset + nbytes > len(raw):
            raise ShardFormatError(f"{name}: field {field!r} runs past the end of the data")
        arrays[field] = np.frombuffer(raw, dtype, count, offset).reshape(spec["shape"])
        offset += nbytes
    if offset != len(raw):
        raise ShardFormatError(f"{name}: {len(raw) - offset} unexpected bytes after the last field")
    return arrays, header["meta"]
