"""Read a corpus: find its files, check them up front, and batch raw records in a fixed order.

Inputs are `.txt`, `.jsonl` and `.parquet` files (each optionally `.zst` or `.gz`), folders,
globs, and `hf:NAME` for a `datasets` dataset read in streaming mode. The reader hands out *raw*
records (undecoded bytes for text formats; see `pipeline.data.record_reader`) in small batches:
decoding (`decode_record`), JSON parsing and tokenizing happen in worker processes, so the
reading process stays cheap and the order of records, and hence the output, is the same
whatever the number of workers.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.common.errors import PipelineError
from pipeline.data.corpus_types import Compression, CorpusOptions, Format, Source
from pipeline.data.record_reader import iter_records, open_binary, parquet_file

FORMATS: dict[str, Format] = {".txt": "txt", ".text": "txt", ".jsonl": "jsonl", ".ndjson": "jsonl",
                              ".parquet": "parquet"}
COMPRESSIONS: dict[str, Compression] = {".zst": "zst", ".zstd": "zst", ".gz": "gz"}
HF_PREFIX = "hf:"
SNIFF_BYTES = 1 << 16


@dataclass
class RecordBatch:
    """Consecutive raw records from one source, with the 1-based line (or row) of each."""

    source: str
    format: Format
    file: int = 0
    """The source's number among the corpus's inputs (`resolve_inputs`' order)."""
    lines: list[int] = field(default_factory=list)
    payloads: list[bytes | str | None] = field(default_factory=list)
    """Raw bytes (txt, jsonl), text (parquet, hf), or None for a record skipped as oversized."""


# ----------------------------------------------------------------------------- resolving inputs


def resolve_inputs(inputs: list[str]) -> list[Source]:
    """Expand paths, folders and globs into sources, in a deterministic order.

    Raises `PipelineError` for a missing path, an unmatched glob or an unknown extension.
    """
    if not inputs:
        raise PipelineError("no --input given")
    sources: list[Source] = []
    for item in inputs:
        if item.startswith(HF_PREFIX):
            name = item[len(HF_PREFIX):]
            if not name:
                raise PipelineError(f"--input {item!r}: expected hf:NAME, e.g. hf:wikitext")
            sources.append(Source(name, "hf"))
        elif glob.has_magic(item):
            matches = sorted(p for p in glob.glob(item, recursive=True) if Path(p).is_file())
            if not matches:
                raise PipelineError(f"--input {item!r}: the pattern matches no file")
            sources.extend(_file_source(Path(p)) for p in matches)
        else:
            path = Path(item)
            if path.is_dir():
                files = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p, path))
                known = [p for p in files if _split_suffixes(p) is not None]
                if not known:
                    raise PipelineError(
                        f"--input {item}: the folder holds no .txt, .jsonl or .parquet file "
                        "(optionally .zst or .gz)")
                sources.extend(_file_source(p) for p in known)
            elif path.is_file():
                sources.append(_file_source(path))
            else:
                raise PipelineError(f"--input {item}: no such file or folder")
    return sources


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def _split_suffixes(path: Path) -> tuple[Format, Compression] | None:
    suffixes = [s.lower() for s in path.suffixes]
    compression: Compression = "none"
    if suffixes and suffixes[-1] in COMPRESSIONS:
        compression = COMPRESSIONS[suffixes.pop()]
    if suffixes and suffixes[-1] in FORMATS:
        return FORMATS[suffixes[-1]], compression
    return None


def _file_source(path: Path) -> Source:
    kind = _split_suffixes(path)
    if kind is None:
        raise PipelineError(
            f"{path}: unknown extension {''.join(path.suffixes) or '(none)'}; expected .txt, .jsonl "
            "or .parquet, optionally followed by .zst or .gz")
    return Source(str(path), *kind)


# ----------------------------------------------------------------------------- up-front checks


def check_sources(sources: list[Source], options: CorpusOptions) -> None:
    """Look at the start of every file before any heavy work, and fail early on bad input.

    Catches unreadable or corrupt compressed files, binary files, parquet files without the text
    column, jsonl files whose first record lacks the text field, and a corpus of empty files.
    """
    nonempty = 0
    for source in sources:
        if source.format == "hf":
            nonempty += 1
            continue
        if source.format == "parquet":
            nonempty += _check_parquet(source, options)
            continue
        head = _read_head(source)
        nul = head.find(b"\x00")
        if nul >= 0:
            raise PipelineError(f"{source.path}: looks like a binary file (NUL byte at offset {nul}), "
                                f"not {source.format} text")
        if head.strip():
            nonempty += 1
        if source.format == "jsonl":
            _check_first_json_record(source, head, options.text_field)
    if nonempty == 0:
        raise PipelineError(f"the corpus is empty: {', '.join(s.path for s in sources)} hold no text")


def _read_head(source: Source) -> bytes:
    try:
        with open_binary(source) as stream:
            return stream.read(SNIFF_BYTES)
    except OSError as err:  # gzip.BadGzipFile and PermissionError are OSErrors
        raise PipelineError(f"{source.path}: cannot read: {err}") from None
    except Exception as err:  # zstandard.ZstdError is not an OSError
        raise PipelineError(f"{source.path}: not a valid {source.compression} file: {err}") from None


def _check_first_json_record(source: Source, head: bytes, text_field: str) -> None:
    for line_no, line in enumerate(head.split(b"\n")[:-1] or head.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            return  # one malformed line is counted later, not fatal
        if isinstance(record, dict) and text_field not in record:
            fields = ", ".join(sorted(map(str, record))) or "(none)"
            raise PipelineError(
                f"{source.path} line {line_no}: the record has no field {text_field!r} "
                f"(fields: {fields}); pass --text-field NAME")
        return


def _check_parquet(source: Source, options: CorpusOptions) -> int:
    try:
        with parquet_file(source) as pf:
            names = pf.schema_arrow.names
            rows = pf.metadata.num_rows
    except PipelineError:
        raise
    except Exception as err:
        raise PipelineError(f"{source.path}: not a readable parquet file: {err}") from None
    if options.text_field not in names:
        raise PipelineError(f"{source.path}: no column {options.text_field!r} (columns: "
                            f"{', '.join(names)}); pass --text-field NAME")
    return int(rows > 0)


# ----------------------------------------------------------------------------- batching


def iter_record_batches(
    sources: list[Source], options: CorpusOptions, batch_records: int = 256, batch_bytes: int = 1 << 20
) -> Iterator[RecordBatch]:
    """Yield raw records from every source in order, grouped in batches of bounded size."""
    for file, source in enumerate(sources):
        yield from batched(source.path, source.format, iter_records(source, options), batch_records, batch_bytes,
                           file)


def batched(
    label: str, fmt: Format, records: Iterator[tuple[int, bytes | str | None]], batch_records: int = 256,
    batch_bytes: int = 1 << 20, file: int = 0,
) -> Iterator[RecordBatch]:
    """Group one source's records in batches of at most `batch_records` records or about `batch_bytes` bytes."""
    batch = RecordBatch(label, fmt, file)
    size = 0
    for line_no, payload in records:
        batch.lines.append(line_no)
        batch.payloads.append(payload)
        size += len(payload) if payload is not None else 0
        if len(batch.lines) >= batch_records or size >= batch_bytes:
            yield batch
            batch, size = RecordBatch(label, fmt, file), 0
    if batch.lines:
        yield batch


def iter_texts(sources: list[Source], options: CorpusOptions) -> Iterator[str]:
    """Decoded document texts in order (for tokenizer training); bad and empty records are skipped."""
    for batch in iter_record_batches(sources, options):
        for payload in batch.payloads:
            text = decode_record(payload, batch.format, options).text
            if text and text.strip():
                yield text


@dataclass(frozen=True)
class Decoded:
    """A raw record turned into text, or why it could not be (`reason` is a skip or repair)."""

    text: str | None
    reason: str | None = None
    """oversized, bad_record or empty (text is None), or invalid_utf8 (text has U+FFFD replacements)."""
    detail: str = ""
    """Where in the record the problem is, for the message."""


def decode_record(payload: bytes | str | None, fmt: Format, options: CorpusOptions) -> Decoded:
    """Decode UTF-8, parse JSON and pick the text field of one raw record; never raises."""
    if payload is None:
        return Decoded(None, "oversized", f"document over --max-doc-bytes {options.max_doc_bytes} skipped")
    repaired = None
    if isinstance(payload, bytes):
        try:
            payload = payload.decode("utf-8")
        except UnicodeDecodeError as err:
            repaired = Decoded(None, "invalid_utf8", f"invalid UTF-8 at byte {err.start} of the line")
            payload = payload.decode("utf-8", errors="replace")
    if fmt == "jsonl":
        try:
            record = json.loads(payload)
        except ValueError as err:
            return Decoded(None, "bad_record", f"malformed JSON ({err})")
        payload = record.get(options.text_field) if isinstance(record, dict) else None
        if not isinstance(payload, str):
            return Decoded(None, "bad_record", f"no string field {options.text_field!r}")
    elif not isinstance(payload, str):
        return Decoded(None, "bad_record", f"field {options.text_field!r} is not a string")
    if not payload.strip():
        return Decoded(None, "empty")
    return Decoded(payload, repaired.reason, repaired.detail) if repaired else Decoded(payload)

