"""Task files as lines, JSONL records and table rows, with `file:line` in every error and `.zst`/`.gz` read as is.

A task file is untrusted input: lines are read with a length bound (`MAX_LINE_BYTES`, so a file
without newlines is not read into memory whole), decoded as strict UTF-8, and every failure — bytes
that are not UTF-8, a line past the bound, a compressed file that does not decompress, JSON nested
too deep — is a `PipelineError` naming the file and line. Real GLUE files have quirks handled here:
MRPC starts with a UTF-8 BOM, and sentences contain quote characters that are text, not CSV
quoting (TSVs are read with `QUOTE_NONE`).
"""

from __future__ import annotations

import csv
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.common.config.size_limits import MAX_LINE_BYTES
from pipeline.common.errors import PipelineError

csv.field_size_limit(MAX_LINE_BYTES)  # a quoted field may span lines, but never past one line's bound


def _decompression_errors() -> tuple[type[BaseException], ...]:
    import zstandard

    return (EOFError, zlib.error, zstandard.ZstdError)


def text_lines(path: str | Path, *, keep_ends: bool = False,
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline) of a text file, decompressing `.zst`/`.gz`.

    A byte-order mark at the start is dropped (MRPC's files have one); `keep_ends` keeps each
    line's newline (for the csv module, whose quoted fields may span lines).
    """
    from pipeline.data.corpus import COMPRESSIONS, Source, open_binary

    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: file not found")
    compression = COMPRESSIONS.get(path.suffix.lower(), "none")
    number = 0
    try:
        with open_binary(Source(str(path), "txt", compression)) as raw:
            while line := raw.readline(max_line_bytes + 1):
                number += 1
                if len(line) > max_line_bytes and not line.endswith(b"\n"):
                    raise PipelineError(f"{path}:{number}: the line is longer than {max_line_bytes:,} bytes, the "
                                        "bound for one line of a task file (pipeline/common/config/size_limits.py); "
                                        "is this the right file?")
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise PipelineError(f"{path}:{number}: not valid UTF-8 (byte {err.start + 1} of the line is "
                                        f"{line[err.start:err.start + 1]!r}); save the file as UTF-8") from None
                if number == 1:
                    text = text.removeprefix("\ufeff")
                yield number, text if keep_ends else text.rstrip("\r\n")
    except _decompression_errors() as err:
        raise PipelineError(f"{path}: cannot decompress it after line {number} ({str(err)[:200]}); the file is "
                            "corrupt or truncated") from None
    except OSError as err:  # gzip's BadGzipFile, an unreadable file
        raise PipelineError(f"{path}: cannot read it after line {number}: {str(err)[:200]}") from None


def parse_json(text: str, where: str) -> Any:
    """`json.loads`, with invalid JSON (or JSON nested too deep to parse) an error naming `where`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise PipelineError(f"{where}: invalid JSON: {err.msg}") from None
    except RecursionError:
        raise PipelineError(f"{where}: invalid JSON: nested too deeply") from None


def jsonl_records(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank line; invalid JSON is an error naming file and line."""
    for number, line in text_lines(path):
        if not line.strip():
            continue
        yield number, parse_json(line, f"{path}:{number}")


def table_rows(path: Path, headerless: tuple[str, ...] | None = None) -> Iterator[tuple[int, dict, list[str]]]:
    """(line number, {column: value}, the columns) of each row of a CSV, TSV or JSONL file (of objects);
    `headerless`: the columns of a CSV or TSV file that has no header row."""
    return _jsonl_rows(path) if path.suffix.lower() == ".jsonl" else _csv_rows(path, headerless)


def _csv_rows(path: Path, headerless: tuple[str, ...] | None):
    if not path.is_file():
        raise PipelineError(f"{path}: file not found")
    tsv = path.suffix.lower() == ".tsv"
    lines = (line for _, line in text_lines(path, keep_ends=True))  # strict UTF-8, bounded lines, BOM dropped
    reader = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE) if tsv else csv.reader(lines)
    try:
        header = list(headerless) if headerless else next(reader, None)
        if header is None:
            raise PipelineError(f"{path}: the file is empty")
        for number, row in enumerate(reader, start=1 if headerless else 2):
            if not row or row == [""]:
                continue
            if len(row) < len(header):
                raise PipelineError(f"{path}:{number}: {len(row)} columns, the header has {len(header)} "
                                    f"({', '.join(header)})")
            yield number, dict(zip(header, row, strict=False)), header
    except csv.Error as err:
        raise PipelineError(f"{path}:{reader.line_num}: not valid {'TSV' if tsv else 'CSV'}: {err}") from None


def _jsonl_rows(path: Path):
    for number, record in jsonl_records(path):
        if not isinstance(record, dict):
            raise PipelineError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        yield number, record, list(record)
