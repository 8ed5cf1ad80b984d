"""The documents of a raw corpus, read as pretraining's sharder reads them, for mining pairs from text.

The inputs are what `data_prep/shard.py` takes (`pipeline.data.corpus.resolve_inputs`): `.txt` (documents separated
by blank lines, or one per line), `.jsonl` with a text key, `.parquet` with a text column, each optionally `.zst` or
`.gz`, folders and globs. Unlike the sharder, which counts and skips bad records over a large corpus, a jsonl record
with no text key (or one that is not a JSON object) is an error naming its file and line: a fine-tuning corpus is
small, and a wrong key would otherwise leave nothing to train on. Empty and oversized documents are skipped and
counted. A jsonl record's title key (when present) and a `.txt` document's leading Markdown heading (`# ...`) are
its title.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass

from pipeline.common.errors import PipelineError
from pipeline.data.corpus import check_sources, decode_record, resolve_inputs
from pipeline.data.corpus_types import CorpusOptions, Source
from pipeline.data.record_reader import iter_records

HEADING = re.compile(r"^#{1,6}[ \t]+(\S.*)$")


@dataclass(frozen=True)
class Document:
    """One document's text, its title (None when it has none) and where it was read (`file:line`)."""

    text: str
    title: str | None
    where: str


def read_documents(inputs: str | list[str], text_key: str = "text", title_key: str = "title",
                   one_doc_per_line: bool = False) -> list[Document]:
    """Every document of `inputs` in order; a jsonl record without `text_key` stops with its file and line."""
    sources = resolve_inputs([inputs] if isinstance(inputs, str) else list(inputs))
    options = CorpusOptions(text_field=text_key, one_doc_per_line=one_doc_per_line)
    if others := [s for s in sources if s.format != "jsonl"]:
        check_sources(others, options)  # binary, corrupt, a missing column (jsonl: every record, below)
    documents, skipped = [], {}
    for source in sources:
        try:
            for line, payload in iter_records(source, options):
                document = _document(source, line, payload, options, title_key)
                if isinstance(document, str):
                    skipped[document] = skipped.get(document, 0) + 1
                else:
                    documents.append(document)
        except PipelineError:
            raise
        except Exception as err:  # gzip, zstandard and pyarrow raise their own types on a corrupt file
            raise PipelineError(f"{source.path}: cannot read it: {err}") from None
    if skipped:
        counts = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items()))
        print(f"warning: {_label(sources)}: {sum(skipped.values())} documents skipped ({counts}); "
              f"{len(documents)} read", file=sys.stderr, flush=True)
    if not documents:
        raise PipelineError(f"{_label(sources)}: no document with text (key {text_key!r})")
    return documents


def _document(source: Source, line: int, payload, options: CorpusOptions, title_key: str) -> Document | str:
    """The record as a `Document`, or why it was skipped (`empty`, `oversized`); a bad jsonl record raises."""
    where = f"{source.path}:{line}"
    if source.format != "jsonl":
        decoded = decode_record(payload, source.format, options)
        if decoded.text is None:
            return decoded.reason or "empty"
        return _with_heading(decoded.text, where) if source.format == "txt" else Document(decoded.text, None, where)
    if payload is None:
        return "oversized"
    try:
        record = json.loads(payload)
    except ValueError as err:
        raise PipelineError(f"{where}: not a JSON record ({err})") from None
    key = options.text_field
    if not isinstance(record, dict) or key not in record:
        keys = ", ".join(map(repr, record)) if isinstance(record, dict) else f"a {type(record).__name__}"
        raise PipelineError(f"{where}: no key {key!r} (keys: {keys or 'none'}); set embedding.corpus.text_key to "
                            "the key that holds each document's text")
    text, title = record[key], record.get(title_key)
    if not isinstance(text, str):
        raise PipelineError(f"{where}: {key!r} must be a string, got {type(text).__name__}")
    if not text.strip():
        return "empty"
    return Document(text, title.strip() if isinstance(title, str) and title.strip() else None, where)


def _with_heading(text: str, where: str) -> Document:
    """A text document whose first line is a Markdown heading: the heading is its title, the rest its text."""
    first, _, rest = text.strip().partition("\n")
    heading = HEADING.match(first)
    if heading and rest.strip():
        return Document(rest.strip(), heading.group(1).strip(), where)
    return Document(text, None, where)


def _label(sources: list[Source]) -> str:
    return sources[0].path if len(sources) == 1 else f"{sources[0].path} and {len(sources) - 1} more inputs"
