"""Shared fixtures: small corpora made on the fly and tokenizers trained on them (no network)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

WORDS = ("the a model token encoder shard packing corpus reader document sequence batch mask "
         "river mountain quietly seven orange language tensor gradient learning pretraining").split()


def make_documents(n: int, seed: int = 0, min_words: int = 5, max_words: int = 120) -> list[str]:
    """Deterministic pseudo-English documents; each starts with a unique marker `docN`."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))]
        docs.append(f"doc{i} " + " ".join(words) + ".")
    return docs


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({"id": i, field: d}) + "\n" for i, d in enumerate(docs)))
    return path


def run_script(script: str, *args: str, check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a data_prep/ or launchers/ script as a user would, capturing its output."""
    proc = subprocess.run([PYTHON, str(ROOT / script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def documents() -> list[str]:
    return make_documents(400)


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(tmp_path_factory, documents) -> Path:
    from pipeline.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("tok") / "bpe"
    train_tokenizer(documents, "bpe", 400, out, min_frequency=1)
    return out


@pytest.fixture(scope="session")
def wordpiece_tokenizer_dir(tmp_path_factory, documents) -> Path:
    from pipeline.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("tok") / "wordpiece"
    train_tokenizer(documents, "wordpiece", 300, out, min_frequency=1)
    return out


@pytest.fixture(scope="session")
def corpus_jsonl(tmp_path_factory, documents) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", documents)
