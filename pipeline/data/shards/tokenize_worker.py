"""What a shard-stage worker process does to one batch of raw records.

Decode (UTF-8, JSON), choose the split by a hash of the text, tokenize, and return flat arrays.
Problems with a record are returned as counts and messages, never raised, so the main process
reports them cleanly instead of a traceback from inside a worker. Imports stay light (numpy,
tokenizers and the corpus module) because every worker process imports this module at start-up.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from pipeline.data.corpus import CorpusOptions, decode_record
from pipeline.data.shards.exact_dedup import normalised_hash
from pipeline.data.shards.origins import origin_keys

MAX_EXAMPLES = 10


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker needs; sent once at pool start-up."""

    tokenizer_json: str
    corpus: CorpusOptions
    val_fraction: float
    strict: bool


@dataclass
class TokenizedBatch:
    """Documents of one record batch, in input order, as flat token ids plus per-document lengths."""

    ids: np.ndarray
    lengths: np.ndarray
    is_val: np.ndarray
    origins: np.ndarray
    """Each document's origin key: its input file's number and its line (`pipeline.data.shards.origins`)."""
    counts: Counter = field(default_factory=Counter)
    """Skipped or repaired records by reason (empty, oversized, bad_record, invalid_utf8), and the
    duplicate_documents and duplicate_tokens left out."""
    examples: list[str] = field(default_factory=list)
    """Up to MAX_EXAMPLES 'file line N: reason' messages for the skipped records."""
    error: str | None = None
    """Set under --strict when a record is bad; the main process stops with this message."""


_settings: WorkerSettings | None = None
_tokenizer = None


def init_worker(settings: WorkerSettings) -> None:
    """Build the tokenizer once per process."""
    global _settings, _tokenizer
    from tokenizers import Tokenizer

    _settings = settings
    _tokenizer = Tokenizer.from_str(settings.tokenizer_json)
    # Literal "<mask>" or "</s>" in a corpus is text, not a control token: without this, the
    # tokenizer would turn it into the special id and corrupt masking and packing downstream.
    _tokenizer.encode_special_tokens = True


def val_score(text: str) -> float:
    """A number in [0, 1) fixed by the document's text; documents under val_fraction go to validation."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def held_out(text: str, val_fraction: float) -> bool:
    """Whether the shard stage puts this document in validation at `val_fraction` (never at 0)."""
    return val_fraction > 0 and val_score(text) < val_fraction


def hash_batch(source: str, fmt: str, lines: list[int], payloads: list) -> np.ndarray:
    """The normalised-text hash of every record of one batch (NO_TEXT where a record has no usable text)."""
    assert _settings is not None, "init_worker was not called"
    hashes = np.zeros(len(payloads), np.uint64)
    for i, payload in enumerate(payloads):
        text = decode_record(payload, fmt, _settings.corpus).text
        if text is not None:
            hashes[i] = normalised_hash(text)
    return hashes


def tokenize_batch(
    source: str, fmt: str, lines: list[int], payloads: list, drop: np.ndarray | None = None, file: int = 0
) -> TokenizedBatch:
    """Decode, split and tokenize one batch of raw records (see `pipeline.data.corpus.RecordBatch`).

    `drop` marks duplicates (`pipeline.data.shards.exact_dedup`): they are tokenized to count their tokens,
    then left out. `file` is the source's number among the inputs, for the documents' origins.
    """
    assert _settings is not None and _tokenizer is not None, "init_worker was not called"
    counts: Counter = Counter()
    examples: list[str] = []
    where = "row" if fmt in ("parquet", "hf") else "line"
    texts: list[str] = []
    kept_lines: list[int] = []
    duplicates: list[str] = []
    for i, (line, payload) in enumerate(zip(lines, payloads, strict=True)):
        decoded = decode_record(payload, fmt, _settings.corpus)
        if drop is not None and drop[i]:
            duplicates.append(decoded.text)
            continue
        if decoded.reason:
            counts[decoded.reason] += 1
            if decoded.reason != "empty":
                message = f"{source} {where} {line}: {decoded.detail}"
                if _settings.strict:
                    return _failed(message + " (--strict)", counts, examples)
                if len(examples) < MAX_EXAMPLES:
                    examples.append(message)
        if decoded.text is not None:
            texts.append(decoded.text)
            kept_lines.append(line)

    if duplicates:
        counts["duplicate_documents"] = len(duplicates)
        counts["duplicate_tokens"] = sum(len(e) for e in _tokenizer.encode_batch_fast(duplicates,
                                                                                      add_special_tokens=False))
    encodings = _tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    lengths = np.fromiter((len(e) for e in encodings), np.int64, len(encodings))
    ids = np.fromiter((i for e in encodings for i in e.ids), np.uint32, int(lengths.sum()))
    fraction = _settings.val_fraction
    is_val = np.fromiter((held_out(t, fraction) for t in texts), bool, len(texts))
    return TokenizedBatch(ids, lengths, is_val, origin_keys(file, kept_lines), counts, examples)


def _failed(error: str, counts: Counter, examples: list[str]) -> TokenizedBatch:
    empty = np.zeros(0, np.int64)
    return TokenizedBatch(empty.astype(np.uint32), empty, empty.astype(bool), empty, counts, examples, error)
