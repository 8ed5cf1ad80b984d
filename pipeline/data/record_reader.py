"""Stream raw records out of one input file: whole, from a byte offset, or some parquet row groups.

Text formats yield undecoded bytes (decoding happens in worker processes); every reader can count
the bytes it takes from storage (`ByteCounter`), which is what rank-local reading saves.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator

from pipeline.common.errors import PipelineError
from pipeline.data.corpus_types import CorpusOptions, Source


class ByteCounter:
    """Bytes read from input files (compressed bytes for compressed files): what a rank costs the storage."""

    def __init__(self) -> None:
        self.total = 0


class LineCount:
    """Lines that start before a byte range's end: where the next range's line numbers go on from."""

    def __init__(self) -> None:
        self.lines = 0


class _CountedFile(io.RawIOBase):
    """A raw file that adds every byte read to a `ByteCounter`."""

    def __init__(self, path: str, counter: ByteCounter):
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by close()
        self._counter = counter

    def readinto(self, buffer) -> int:
        n = self._file.readinto(buffer)
        self._counter.total += n or 0
        return n

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()
        super().close()


class _GzipReader(gzip.GzipFile):
    """A gzip stream over an open file that it closes too (GzipFile leaves a `fileobj` open)."""

    def __init__(self, raw: io.BufferedIOBase):
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def open_binary(source: Source, counter: ByteCounter | None = None) -> io.BufferedIOBase:
    """Open a file for reading, decompressing `.zst` and `.gz` on the fly; `counter` counts the bytes read."""
    if counter is None:
        raw = open(source.path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    else:
        raw = io.BufferedReader(_CountedFile(source.path, counter), 1 << 16)
    if source.compression == "gz":
        return _GzipReader(raw)
    if source.compression == "zst":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
        return io.BufferedReader(reader, buffer_size=1 << 20)
    return raw


class parquet_file:
    """Context manager giving a `pyarrow.parquet.ParquetFile`, decompressing `.zst`/`.gz` to a temp file."""

    def __init__(self, source: Source, counter: ByteCounter | None = None):
        self.source = source
        self.counter = counter
        self._tmp = None

    def __enter__(self):
        import pyarrow.parquet as pq

        if self.source.compression == "none":
            return pq.ParquetFile(self.source.path)
        import shutil
        import tempfile

        # Parquet needs random access, so a compressed file is spooled to disk (not memory).
        self._tmp = tempfile.NamedTemporaryFile(suffix=".parquet")  # noqa: SIM115
        with open_binary(self.source, self.counter) as stream:
            shutil.copyfileobj(stream, self._tmp, 1 << 20)
        self._tmp.flush()
        return pq.ParquetFile(self._tmp.name)

    def __exit__(self, *exc):
        if self._tmp is not None:
            self._tmp.close()


def iter_records(
    source: Source, options: CorpusOptions, counter: ByteCounter | None = None
) -> Iterator[tuple[int, bytes | str | None]]:
    """(line or row number, raw record) of one whole source, in order."""
    if source.format in ("jsonl", "txt"):
        with open_binary(source, counter) as stream:
            if source.format == "jsonl" or options.one_doc_per_line:
                yield from iter_line_records(stream, options.max_doc_bytes)
            else:
                yield from iter_paragraph_docs(stream, options.max_doc_bytes)
    elif source.format == "parquet":
        with parquet_file(source, counter) as pf:  # a compressed file's bytes are counted as it is spooled
            row_counter = counter if source.compression == "none" else None
            yield from iter_parquet_rows(pf, options, range(pf.num_row_groups), row_counter)
    elif source.format == "hf":
        for row, text in enumerate(_iter_hf_texts(source, options), start=1):
            yield row, _text_or_oversized(text, options.max_doc_bytes)


def iter_parquet_rows(
    pf, options: CorpusOptions, row_groups: range, counter: ByteCounter | None = None
) -> Iterator[tuple[int, str | None]]:
    """(1-based row number, text) of the given row groups of an open parquet file."""
    meta = pf.metadata
    column = pf.schema_arrow.get_field_index(options.text_field)
    row = sum(meta.row_group(i).num_rows for i in range(row_groups.start))
    if counter is not None:  # what pyarrow reads from storage: the text column's chunks of these row groups
        counter.total += sum(meta.row_group(i).column(column).total_compressed_size for i in row_groups)
    if not len(row_groups):
        return
    for batch in pf.iter_batches(columns=[options.text_field], batch_size=1024, row_groups=list(row_groups)):
        for text in batch.column(0).to_pylist():
            row += 1
            yield row, _text_or_oversized(text, options.max_doc_bytes)


def _text_or_oversized(text, max_doc_bytes: int):
    # len(str) counts characters, at most 4 bytes each: a cheap bound before encoding.
    if isinstance(text, str) and len(text) * 4 > max_doc_bytes and len(text.encode()) > max_doc_bytes:
        return None
    return text


def _iter_hf_texts(source: Source, options: CorpusOptions) -> Iterator[object]:
    import datasets

    try:
        stream = datasets.load_dataset(source.path, options.hf_config, split=options.hf_split, streaming=True)
    except Exception as err:  # datasets raises many types; all mean "cannot open this dataset"
        raise PipelineError(f"hf:{source.path}: cannot open the dataset: {err}") from None
    for row in stream:
        if options.text_field not in row:
            raise PipelineError(f"hf:{source.path}: rows have no field {options.text_field!r} "
                                f"(fields: {', '.join(row)}); pass --text-field NAME")
        yield row[options.text_field]


def iter_lines(
    stream: io.BufferedIOBase, max_bytes: int, offset: int = 0
) -> Iterator[tuple[int, int, bytes | None]]:
    """Yield (line number, byte offset, line without its newline), or None in place of a line over `max_bytes`.

    `offset` is where the stream stands, so that offsets are the file's. An oversized line is skipped
    in bounded chunks, so a 50 MB (or 50 GB) line never sits in memory.
    """
    line_no = 0
    while True:
        at = offset
        line = stream.readline(max_bytes + 1)
        if not line:
            return
        line_no += 1
        offset += len(line)
        if len(line) > max_bytes and not line.endswith(b"\n"):
            while True:  # discard the rest of the line
                rest = stream.readline(1 << 20)
                offset += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
            yield line_no, at, None
            continue
        yield line_no, at, line.rstrip(b"\r\n")


def iter_line_records(
    stream: io.BufferedIOBase, max_bytes: int, offset: int = 0, stop: int | None = None,
    count: LineCount | None = None,
) -> Iterator[tuple[int, bytes | None]]:
    """Non-blank lines (jsonl records, or one-document-per-line text) that start before byte `stop`; `count`
    counts the lines (blank too) that start before it."""
    for line_no, at, line in iter_lines(stream, max_bytes, offset):
        if stop is not None and at >= stop:
            return
        if count is not None:
            count.lines = line_no
        if line is None or line.strip():
            yield line_no, line


def iter_paragraph_docs(
    stream: io.BufferedIOBase, max_doc_bytes: int, offset: int = 0, stop: int | None = None, inside: bool = False,
    count: LineCount | None = None,
) -> Iterator[tuple[int, bytes | None]]:
    """Documents separated by blank lines that start before byte `stop`; a document over `max_doc_bytes` yields None.

    `inside`: the stream starts in the middle of a document, which belongs to whoever reads its
    first line, so it is skipped. `count` counts the lines that start before `stop`.
    """
    lines: list[bytes] = []
    first = 0
    size = 0
    oversized = False
    for line_no, at, line in iter_lines(stream, max_doc_bytes, offset):
        if count is not None and (stop is None or at < stop):
            count.lines = line_no
        blank = line is not None and not line.strip()
        if inside:
            inside = not blank
            continue
        if blank:
            if lines or oversized:
                yield first, None if oversized else b"\n".join(lines)
            lines, size, oversized = [], 0, False
            continue
        if not lines and not oversized:
            if stop is not None and at >= stop:
                return
            first = line_no
        if line is None or oversized or size + len(line) > max_doc_bytes:
            lines, oversized = [], True
            continue
        lines.append(line)
        size += len(line) + 1
    if lines or oversized:
        yield first, None if oversized else b"\n".join(lines)
