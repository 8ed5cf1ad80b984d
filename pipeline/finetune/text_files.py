"""Task files as lines and JSONL records, with `file:line` in every error and `.zst`/`.gz` read as is."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.common.errors import PipelineError


def text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline) of a text file, decompressing `.zst`/`.gz`."""
    from pipeline.data.corpus import COMPRESSIONS, Source, open_binary

    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path}: file not found")
    compression = COMPRESSIONS.get(path.suffix.lower(), "none")
    with open_binary(Source(str(path), "txt", compression)) as raw:
        for number, line in enumerate(io.TextIOWrapper(raw, encoding="utf-8-sig"), start=1):
            yield number, line.rstrip("\r\n")


def jsonl_records(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank line; invalid JSON is an error naming file and line."""
    for number, line in text_lines(path):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as err:
            raise PipelineError(f"{path}:{number}: invalid JSON: {err.msg}") from None
