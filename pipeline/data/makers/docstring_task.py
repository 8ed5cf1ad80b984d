"""Tasks from the embedded corpus: which standard-library package a docstring comes from, and docstring search.

They need no download and no labels beyond what the corpus records already carry (`source`), so
the main job can show what pretraining buys downstream on any machine. Train/dev membership is a
hash of the text, so it is the same on every run.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

from pipeline.common.atomic_files import write_atomic
from pipeline.common.errors import PipelineError


def package_of(source: str) -> str:
    """`docstring:email.mime.text.MIMEText` → `email`; a leading underscore is dropped (`_pydecimal`)."""
    return source.removeprefix("docstring:").split(".")[0].lstrip("_").removeprefix("py")


def write_package_task(corpus: Path, out: Path, classes: int = 6, dev_fraction: float = 0.2,
                       max_chars: int = 600) -> dict:
    """Write `out/train.jsonl` and `out/dev.jsonl` ({"text", "label"}) for the `classes` largest packages."""
    records = [json.loads(line) for line in Path(corpus).read_text(encoding="utf-8").splitlines() if line.strip()]
    docstrings = [r for r in records if r.get("kind") == "docstring"]
    counts = Counter(package_of(r["source"]) for r in docstrings)
    packages = [name for name, _ in counts.most_common(classes)]
    if len(packages) < 2:
        raise PipelineError(f"{corpus}: fewer than 2 packages with docstrings; is it the embedded corpus?")
    splits: dict[str, list[str]] = {"train": [], "dev": []}
    for r in docstrings:
        label = package_of(r["source"])
        if label in packages:
            text = r["text"][:max_chars]
            bucket = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") / 2**64
            splits["dev" if bucket < dev_fraction else "train"].append(json.dumps({"text": text, "label": label}))
    out.mkdir(parents=True, exist_ok=True)
    for name, lines in splits.items():
        write_atomic(out / f"{name}.jsonl", ("\n".join(lines) + "\n").encode())
    return {"labels": sorted(packages), "train": len(splits["train"]), "dev": len(splits["dev"])}


FIRST_SENTENCE = re.compile(r"(.+?[.!?])\s+(\S.*)", re.S)
MIN_DOCUMENT_WORDS = 8


def _dev_bucket(text: str) -> float:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") / 2**64


def write_search_task(corpus: Path, out: Path, dev_fraction: float = 0.2, max_chars: int = 600) -> dict:
    """Write `out/train.jsonl` and `out/dev.jsonl` as search pairs ({"query", "positive"}): each docstring's first
    sentence is the query, the rest of it (at least `MIN_DOCUMENT_WORDS` words, cut at `max_chars`) the document."""
    records = [json.loads(line) for line in Path(corpus).read_text(encoding="utf-8").splitlines() if line.strip()]
    splits: dict[str, list[str]] = {"train": [], "dev": []}
    for r in records:
        found = FIRST_SENTENCE.match(r["text"].strip()) if r.get("kind") == "docstring" else None
        if found and len(found.group(2).split()) >= MIN_DOCUMENT_WORDS:
            query, document = " ".join(found.group(1).split()), found.group(2)[:max_chars]
            bucket = "dev" if _dev_bucket(document) < dev_fraction else "train"
            splits[bucket].append(json.dumps({"query": query, "positive": document}))
    if not splits["train"] or not splits["dev"]:
        raise PipelineError(f"{corpus}: too few docstrings with a first sentence and a body for a search task")
    out.mkdir(parents=True, exist_ok=True)
    for name, lines in splits.items():
        write_atomic(out / f"{name}.jsonl", ("\n".join(lines) + "\n").encode())
    return {"train": len(splits["train"]), "dev": len(splits["dev"])}


def write_document_split(corpus: Path, out: Path, val_fraction: float) -> dict:
    """Write the corpus's documents as `out/train.jsonl` and `out/dev.jsonl` ({"text"}), split as the shard stage
    splits them at `val_fraction`: dev holds the documents pretraining holds out, for a corpus stage's selection."""
    from pipeline.data.shards.tokenize_worker import held_out

    records = [json.loads(line) for line in Path(corpus).read_text(encoding="utf-8").splitlines() if line.strip()]
    splits: dict[str, list[str]] = {"train": [], "dev": []}
    for r in records:
        splits["dev" if held_out(r["text"], val_fraction) else "train"].append(json.dumps({"text": r["text"]}))
    if not splits["train"] or not splits["dev"]:
        raise PipelineError(f"{corpus}: at --val-fraction {val_fraction}, no document is held out (or none is left "
                            "to train on)")
    out.mkdir(parents=True, exist_ok=True)
    for name, lines in splits.items():
        write_atomic(out / f"{name}.jsonl", ("\n".join(lines) + "\n").encode())
    return {"train": len(splits["train"]), "dev": len(splits["dev"])}
