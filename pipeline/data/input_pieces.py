"""Rank-local reading: which piece of the corpus each of `world_size` ranks reads, and reading only that.

The assignment is a pure function of the inputs (their order and sizes) and `world_size`, so a
rerun, a resumed rank and the combine step all see the same pieces.

- One rank: every source whole, in order (the single-process stage).
- At least as many files as ranks: whole files, each to the least-loaded rank by bytes (largest
  first), so ranks read about the same amount; a rank reads its files in input order.
- Fewer files than ranks: each file is cut into `world_size` pieces and rank R reads piece R:
  - plain `.txt` / `.jsonl`: byte ranges. A record (line, or blank-line-separated document)
    belongs to the piece where it *starts*; a reader seeks to its start, skips the partial record
    there, and finishes the last record it began even past its end (Hadoop's TextInputFormat rule).
  - plain `.parquet`: contiguous row groups (ranks beyond the number of row groups get none).
  - compressed files (`.zst`, `.gz`, compressed parquet) and `hf:` datasets cannot be entered
    in the middle without decompressing everything before the cut. Every rank sharing such a
    source reads all of it and keeps every `world_size`-th record batch. Reading and
    decompressing cost about 1% of tokenizing (IMDB's 36 MB .zst: 3 s against 317 s, measured
    on the same loaded cores), so the ranks still divide the
    real work; the storage reads are not divided, though. To read 1/W each, give at least W
    files, or a plain file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from pipeline.data.corpus import CorpusOptions, RecordBatch, Source, batched
from pipeline.data.record_reader import (
    ByteCounter,
    LineCount,
    iter_line_records,
    iter_paragraph_docs,
    iter_parquet_rows,
    iter_records,
    open_binary,
    parquet_file,
)

PieceKind = Literal["whole", "bytes", "row_groups", "stride"]
_WHITESPACE = b" \t\r\x0b\x0c"  # what bytes.strip() removes, less the newline


@dataclass(frozen=True)
class InputPiece:
    """The part of one source that one rank reads."""

    source: Source
    file: int = 0
    """The source's place in the corpus's inputs (its number in index.json's `origins.files`)."""
    kind: PieceKind = "whole"
    start: int = 0
    """First byte (`bytes`) or first row group (`row_groups`)."""
    stop: int = 0
    """End byte or end row group, exclusive."""


def assign_inputs(sources: list[Source], rank: int, world_size: int) -> list[InputPiece]:
    """The pieces rank `rank` of `world_size` reads; over all ranks they cover every record exactly once."""
    if world_size == 1:
        return [InputPiece(source, i) for i, source in enumerate(sources)]
    if len(sources) >= world_size:
        sizes = [_size(source) for source in sources]
        loads = [0] * world_size
        owner = {}
        for i in sorted(range(len(sources)), key=lambda i: (-sizes[i], i)):
            owner[i] = min(range(world_size), key=lambda r: (loads[r], r))
            loads[owner[i]] += sizes[i]
        return [InputPiece(source, i) for i, source in enumerate(sources) if owner[i] == rank]
    pieces = [_share(source, i, rank, world_size) for i, source in enumerate(sources)]
    return [piece for piece in pieces if piece is not None]


def _size(source: Source) -> int:
    return 0 if source.format == "hf" else os.path.getsize(source.path)


def _share(source: Source, file: int, rank: int, world_size: int) -> InputPiece | None:
    if source.compression != "none" or source.format == "hf":
        return InputPiece(source, file, "stride")
    if source.format == "parquet":
        with parquet_file(source) as pf:
            groups = pf.num_row_groups
        start, stop = groups * rank // world_size, groups * (rank + 1) // world_size
        return InputPiece(source, file, "row_groups", start, stop) if stop > start else None
    size = _size(source)
    return InputPiece(source, file, "bytes", size * rank // world_size, size * (rank + 1) // world_size)


def iter_piece_batches(
    pieces: list[InputPiece], options: CorpusOptions, rank: int, world_size: int, counter: ByteCounter | None = None,
    lines: dict[InputPiece, int] | None = None,
) -> Iterator[RecordBatch]:
    """Raw record batches of this rank's pieces, in order.

    A byte range's line numbers count from its first line; once its batches are all read,
    `lines[piece]` holds how many lines start in it (what the next range's numbers go on from).
    Every other piece numbers lines, rows and records from its source's start.
    """
    for piece in pieces:
        source = piece.source
        if piece.kind == "whole":
            yield from batched(source.path, source.format, iter_records(source, options, counter), file=piece.file)
        elif piece.kind == "stride":
            records = iter_records(source, options, counter)
            for i, batch in enumerate(batched(source.path, source.format, records, file=piece.file)):
                if i % world_size == rank:
                    yield batch
        elif piece.kind == "row_groups":
            with parquet_file(source) as pf:
                rows = iter_parquet_rows(pf, options, range(piece.start, piece.stop), counter)
                yield from batched(source.path, source.format, rows, file=piece.file)
        else:
            count = LineCount()
            yield from _byte_range_batches(piece, options, counter, count)
            if lines is not None:
                lines[piece] = count.lines


def _byte_range_batches(
    piece: InputPiece, options: CorpusOptions, counter: ByteCounter | None, count: LineCount
) -> Iterator[RecordBatch]:
    source = piece.source
    with open_binary(source, counter) as stream:
        at = _seek_to_line_start(stream, piece.start) if piece.start > 0 else 0
        if at >= piece.stop:
            return  # one line spans the whole piece: it belongs to the piece where it starts
        # Line numbers count from the piece's first line; the label says where that is.
        label = source.path if at == 0 else f"{source.path} (from byte {at})"
        if source.format == "jsonl" or options.one_doc_per_line:
            records = iter_line_records(stream, options.max_doc_bytes, at, piece.stop, count)
        else:
            inside = at > 0 and not _previous_line_blank(stream, at)
            records = iter_paragraph_docs(stream, options.max_doc_bytes, at, piece.stop, inside=inside, count=count)
        yield from batched(label, source.format, records, file=piece.file)


def _seek_to_line_start(stream, start: int) -> int:
    """Move to the first line that starts at or after byte `start`; return its offset."""
    stream.seek(start - 1)
    at = start - 1
    while True:
        chunk = stream.readline(1 << 20)
        at += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return at


def _previous_line_blank(stream, at: int) -> bool:
    """Whether the line that ends just before byte `at` holds only whitespace (then a document may start at `at`).

    In blank-line-separated text this decides whether `at` starts a document or is inside one.
    """
    end = at - 1  # byte at - 1 is that line's newline
    blank = True
    while end > 0:
        begin = max(0, end - 4096)
        stream.seek(begin)
        chunk = stream.read(end - begin)
        for byte in reversed(chunk):
            if byte == 0x0A:
                end = 0
                break
            if byte not in _WHITESPACE:
                blank, end = False, 0
                break
        else:
            end = begin
    stream.seek(at)
    return blank
