"""What the corpus and its record reader share: one input (`Source`) and how to read it (`CorpusOptions`).

`corpus.py` finds and checks the inputs and batches their records; `record_reader.py` streams the
records of one input. Both speak of these types, which import neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Format = Literal["txt", "jsonl", "parquet", "hf"]
Compression = Literal["none", "zst", "gz"]

DEFAULT_MAX_DOC_BYTES = 10_000_000


@dataclass(frozen=True)
class Source:
    """One input: a file with its format and compression, or a `datasets` dataset name."""

    path: str
    format: Format
    compression: Compression = "none"


@dataclass(frozen=True)
class CorpusOptions:
    """How to read the inputs; every field is part of the output's identity."""

    text_field: str = "text"
    """Field holding the text in jsonl records, parquet columns and `datasets` rows."""
    one_doc_per_line: bool = False
    """For .txt: each non-blank line is a document (default: documents are separated by blank lines)."""
    max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES
    """Documents larger than this many bytes are skipped and counted, never loaded whole."""
    hf_config: str | None = None
    """Configuration name for `hf:` inputs."""
    hf_split: str = "train"
    """Split to stream for `hf:` inputs."""
