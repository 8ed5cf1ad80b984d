"""What identifies a model's content, so that reuse (of an export, of a finished fine-tuning seed) is
decided by what a folder holds rather than by its name.

A run retrained into the same output folder reaches the same checkpoint path and step with other
weights; a path alone would then hand back the old export, or skip seeds trained on the old model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from pipeline.common.atomic_files import sha256_file
from pipeline.models.card import CARD_FILE

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".h5", ".msgpack")
PROVENANCE_PREFIX = "pipeline_"  # our own provenance files say where a folder came from, not what it holds


def checkpoint_fingerprint(record) -> str:
    """A checkpoint's identity from its record (pretrain/checkpoints/record.py): every file's sha256, step, config."""
    what = {"files": record.files, "step": record.step, "config": record.config}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def model_fingerprint(model: str, *, weights: bool = True) -> str | None:
    """A digest of an HF model folder's files (None for a hub name, which names a fixed revision).

    With `weights=False` only the config and tokenizer count: what a from-scratch run builds from.
    """
    folder = Path(model)
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.name.startswith(PROVENANCE_PREFIX) or path.name == CARD_FILE:
            continue  # what the folder says of itself, not what it holds
        if not weights and path.name.endswith(WEIGHT_SUFFIXES):
            continue
        digest.update(f"{path.name}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()[:16]


def describe_differences(there: dict, now: dict, keys: Iterable[str] | None = None) -> list[str]:
    """`key A there, B now` for each key (`keys`, else every key of either) whose value differs, so that a
    refused reuse names what changed; inside nested dicts, each differing setting by both keys (`recipe lr ...`)."""
    found = []
    for key in sorted(there.keys() | now.keys()) if keys is None else keys:
        before, after = there.get(key), now.get(key)
        if isinstance(before, dict) and isinstance(after, dict):
            found += [f"{key} {inner}" for inner in describe_differences(before, after)]
        elif before != after:
            found.append(f"{key} {before!r} there, {after!r} now")
    return found
