"""Embedding files: jsonl records of pairs, scored pairs, texts, labelled pairs and clusters, checked line by line.

Every shape is read into the fine-tuning `Split` (texts as tuples, labels as numbers), so the selection slice,
the seeds and the reports handle them as they handle any task:

    pairs                 {"query", "positive", "negative"?}   texts (query, positive[, negative])
    scored pairs (STS)    {"sentence1", "sentence2", "score"}  texts (sentence1, sentence2), labels = scores
    texts (SimCSE)        {"text"}                             texts (text,)
    labelled pairs        {"sentence1", "sentence2", "label"}  texts (sentence1, sentence2), labels 0 or 1
    clusters              {"text", "label"}                    texts (text,), labels = cluster ids

A missing key, an empty text, a query with no positive, a score outside the declared range or a label that is
not 0/1 stops with an error naming the file and line. Exact duplicate records are dropped and counted in one
warning. Texts longer than the model's positions are truncated and counted (`warn_truncated`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.splits import Split
from pipeline.data.tasks.text_files import jsonl_records

PAIR_KEYS = ("query", "positive", "negative")
SCORED_KEYS = ("sentence1", "sentence2", "score")
TEXT_KEYS = ("text",)
LABELLED_PAIR_KEYS = ("sentence1", "sentence2", "label")
CLUSTER_KEYS = ("text", "label")


def _text(record: dict, key: str, where: str) -> str:
    if key not in record:
        raise PipelineError(f"{where}: no key {key!r} (keys: {', '.join(map(repr, record)) or 'none'})")
    value = record[key]
    if not isinstance(value, str):
        raise PipelineError(f"{where}: {key!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise PipelineError(f"{where}: {key!r} is an empty text")
    return value


def _read(path: str | Path, what: str, parse: Callable[[dict, str], tuple[tuple[str, ...], Any]]) -> Split:
    """Each record of `path` through `parse` → (texts, label); exact duplicates dropped and counted."""
    path = Path(path)
    split, seen, duplicates, first = Split(str(path), labels=[]), set(), 0, None
    for number, record in jsonl_records(path):
        where = f"{path}:{number}"
        if not isinstance(record, dict):
            raise PipelineError(f"{where}: expected a JSON object, got {type(record).__name__}")
        texts, label = parse(record, where)
        if (texts, label) in seen:
            duplicates, first = duplicates + 1, first or number
            continue
        seen.add((texts, label))
        split.texts.append(texts)
        split.labels.append(label)
        split.ids.append(str(number))
    if not split.texts:
        raise PipelineError(f"{path}: no {what} (the file is empty)")
    if duplicates:
        print(f"warning: {path}: {duplicates} duplicate {what} dropped (the first at line {first}); "
              f"{len(split)} kept", file=sys.stderr, flush=True)
    if all(label is None for label in split.labels):
        split.labels = None
    return split


def read_pairs(path: str | Path) -> Split:
    """(query, positive[, negative]) records: a query searches for its positive; a negative is a hard one."""
    def parse(record: dict, where: str) -> tuple[tuple[str, ...], None]:
        query = _text(record, "query", where)
        if not isinstance(record.get("positive"), str) or not record["positive"].strip():
            raise PipelineError(f"{where}: the query has no positive (a non-empty \"positive\" text is required)")
        positive = record["positive"]
        negative = _text(record, "negative", where) if record.get("negative") is not None else None
        return (query, positive) if negative is None else (query, positive, negative), None

    return _read(path, "pairs", parse)


def read_scored_pairs(path: str | Path, score_range: tuple[float, float] | list[float]) -> Split:
    """(sentence1, sentence2) with a similarity `score` inside `score_range` (inclusive)."""
    low, high = score_range

    def parse(record: dict, where: str) -> tuple[tuple[str, ...], float]:
        texts = (_text(record, "sentence1", where), _text(record, "sentence2", where))
        if "score" not in record:
            raise PipelineError(f"{where}: no key 'score' (keys: {', '.join(map(repr, record))})")
        score = record["score"]
        if isinstance(score, bool) or not isinstance(score, int | float) or not low <= score <= high:
            raise PipelineError(f"{where}: score {score!r} is outside the declared range [{low:g}, {high:g}] "
                                "(embedding.score_range)")
        return texts, float(score)

    return _read(path, "scored pairs", parse)


def read_texts(path: str | Path) -> Split:
    """Texts alone (SimCSE: each text is its own positive, under two dropout masks)."""
    return _read(path, "texts", lambda record, where: ((_text(record, "text", where),), None))


def read_labelled_pairs(path: str | Path) -> Split:
    """(sentence1, sentence2) with `label` 1 (same meaning) or 0: pair classification."""
    def parse(record: dict, where: str) -> tuple[tuple[str, ...], int]:
        texts = (_text(record, "sentence1", where), _text(record, "sentence2", where))
        if "label" not in record:
            raise PipelineError(f"{where}: no key 'label' (keys: {', '.join(map(repr, record))})")
        label = record["label"]
        if str(label) not in ("0", "1"):
            raise PipelineError(f"{where}: label {label!r} must be 0 or 1")
        return texts, int(str(label))

    return _read(path, "labelled pairs", parse)


def read_clusters(path: str | Path) -> Split:
    """(text,) with a cluster `label` (any string or number), numbered in order of first appearance."""
    names: dict[str, int] = {}

    def parse(record: dict, where: str) -> tuple[tuple[str, ...], int]:
        text = _text(record, "text", where)
        if "label" not in record or record["label"] is None or str(record["label"]) == "":
            raise PipelineError(f"{where}: no key 'label' (each text needs its cluster's label)")
        return (text,), names.setdefault(str(record["label"]), len(names))

    return _read(path, "clustered texts", parse)


def count_truncated(tokenizer, texts: list[str], max_len: int) -> int:
    """How many of `texts` are longer than `max_len` tokens, special tokens included."""
    special = tokenizer.num_special_tokens_to_add(pair=False)
    lengths = tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    return sum(len(ids) + special > max_len for ids in lengths)


def warn_truncated(what: str, truncated: int, total: int, max_len: int) -> None:
    """The counted warning for texts cut at the model's positions (or the configured length)."""
    if truncated:
        print(f"warning: {what}: {truncated} of {total} texts are longer than {max_len} tokens and were truncated",
              file=sys.stderr, flush=True)
