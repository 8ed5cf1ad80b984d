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

from pipeline.common.config.size_limits import MAX_SHARD_BYTES

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


ARRAY_KINDS = "biuf"
"""Numeric dtypes only: a header naming an object dtype (pickled Python objects) is refused."""


def _frame_content_size(data: bytes, name: str, max_bytes: int) -> int | None:
    """The size a frame declares (None if it declares none); more than `max_bytes` is refused before a byte
    is allocated for it."""
    import zstandard

    try:
        params = zstandard.get_frame_parameters(data)
    except zstandard.ZstdError as err:
        raise ShardFormatError(f"{name}: not a zstd frame ({err}); the file is corrupt or truncated") from None
    if params.content_size not in (zstandard.CONTENTSIZE_UNKNOWN, zstandard.CONTENTSIZE_ERROR) \
            and params.content_size > max_bytes:
        raise ShardFormatError(f"{name}: the zstd frame declares {params.content_size:,} bytes, more than the "
                               f"{max_bytes:,} expected at most; the file is corrupt or hostile")
    if params.content_size in (zstandard.CONTENTSIZE_UNKNOWN, zstandard.CONTENTSIZE_ERROR):
        return None
    return params.content_size


def decompress_bounded(data: bytes, name: str, max_bytes: int) -> bytes:
    """One zstd frame → at most `max_bytes` bytes, whatever the frame claims or really expands to."""
    import zstandard

    if _frame_content_size(data, name, max_bytes) is not None:
        try:  # the declared size, checked above, is what zstd allocates; more output than declared is an error
            return zstandard.ZstdDecompressor().decompress(data)
        except zstandard.ZstdError as err:
            raise ShardFormatError(f"{name}: cannot decompress ({err}); the file is corrupt or truncated") from None
    chunks, total = [], 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=False)
        while chunk := reader.read(min(1 << 24, max_bytes + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise ShardFormatError(f"{name}: the zstd frame expands past the {max_bytes:,} bytes expected at "
                                       "most; the file is corrupt or hostile")
    except zstandard.ZstdError as err:
        raise ShardFormatError(f"{name}: cannot decompress ({err}); the file is corrupt or truncated") from None
    return b"".join(chunks)


def decode(data: bytes, name: str = "shard", max_bytes: int = MAX_SHARD_BYTES) -> tuple[dict[str, np.ndarray], dict]:
    """Inverse of `encode`; raises `ShardFormatError` naming `name` on any inconsistency.

    Decompression stops at `max_bytes` (a reader passes the bound its index's counts imply), and
    the header is checked field by field before any array is made from it.
    """
    return parse(decompress_bounded(data, name, max_bytes), name)


def parse(raw: bytes | memoryview, name: str = "shard") -> tuple[dict[str, np.ndarray], dict]:
    """Decompressed container bytes (or a memory map of them) → zero-copy arrays and metadata."""
    if raw[: len(MAGIC)] != MAGIC or len(raw) < len(MAGIC) + 4:
        raise ShardFormatError(f"{name}: not a shard file (bad magic bytes)")
    (header_len,) = struct.unpack_from("<I", raw, len(MAGIC))
    offset = len(MAGIC) + 4
    if offset + header_len > len(raw):
        raise ShardFormatError(f"{name}: the header ({header_len:,} bytes) runs past the end of the data")
    try:
        header = json.loads(raw[offset: offset + header_len])
    except (ValueError, RecursionError):
        raise ShardFormatError(f"{name}: the header is not valid JSON") from None
    offset += header_len
    if not isinstance(header, dict) or not isinstance(header.get("fields"), dict) \
            or not isinstance(header.get("meta", {}), dict):
        raise ShardFormatError(f"{name}: the header should be an object with 'fields' and 'meta' objects")
    arrays = {}
    for field, spec in header["fields"].items():
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape) or len(shape) > 8:
            raise ShardFormatError(f"{name}: field {field!r} has no valid shape (a list of non-negative integers)")
        try:
            dtype = np.dtype(spec.get("dtype"))
        except (TypeError, ValueError):
            raise ShardFormatError(f"{name}: field {field!r} has an unknown dtype {spec.get('dtype')!r}") from None
        if dtype.kind not in ARRAY_KINDS or dtype.itemsize > 8:
            raise ShardFormatError(f"{name}: field {field!r} has dtype {dtype}, not a plain number type")
        count = 1
        for n in shape:
            count *= n  # Python integers: no overflow to wrap a huge shape into a small one
        nbytes = count * dtype.itemsize
        if offset + nbytes > len(raw):
            raise ShardFormatError(f"{name}: field {field!r} runs past the end of the data")
        arrays[field] = np.frombuffer(raw, dtype, count, offset).reshape(shape)
        offset += nbytes
    if offset != len(raw):
        raise ShardFormatError(f"{name}: {len(raw) - offset} unexpected bytes after the last field")
    return arrays, header.get("meta", {})
