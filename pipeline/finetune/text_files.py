"""Task files as lines and JSONL records, with `file:line` in every error and `.zst`/`.gz` read as is.

A task file is untrusted input: lines are read with a length bound (`MAX_LINE_BYTES`, so a file
without newlines is not read into memory whole), decoded as strict UTF-8, and every failure — bytes
that are not UTF-8, a line past the bound, a compressed file that does not decompress, JSON nested
too deep — is a `PipelineError` naming the file and line.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.common.errors import PipelineError
from pipeline.common.size_limits import MAX_LINE_BYTES


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
                                        "bound for one line of a task file (pipeline/common/size_limits.py); "
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
