"""SentEval's bigram-shift task (Conneau et al. 2018) from held-out corpus text: were two adjacent words swapped?

Each sentence is used once, either as it is (label 0) or with one pair of adjacent words swapped
(label 1), half and half. A swapped sentence holds the same tokens as its source, so a model that
only counts tokens (`token_baseline.py`) sits at chance by construction; only word order tells
the classes apart. The sentences come from documents the shard stage held out for validation (its
own `val_score` rule and fraction), so the pretrained encoder never trained on them.

Two cues that are not word order are kept out: punctuation is split from words and only two
adjacent words (letters or digits, and different) are swapped, so a period never moves inside a
sentence; and the first word is never moved, so a capital letter never appears mid-sentence.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.atomic_files import write_atomic
from pipeline.common.errors import PipelineError
from pipeline.data.shards.tokenize_worker import held_out

LABELS = {0: "original", 1: "swapped"}

# Hand-written rather than a sentence splitter from NLTK or spaCy: neither is a dependency, and
# prose sentences of the corpora here end in . ! or ? followed by white space.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
TOKEN = re.compile(r"\w+(?:'\w+)*|[^\w\s]")
WORD = re.compile(r"\w+(?:'\w+)*")


def sentences_of(text: str, min_words: int = 6, max_words: int = 30) -> list[list[str]]:
    """Prose sentences of a document as tokens (punctuation split off): one line of prose each, mostly words."""
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(line.strip() for line in paragraph.splitlines())
        for sentence in SENTENCE_END.split(flat):
            tokens = TOKEN.findall(sentence)
            words = [t for t in tokens if WORD.fullmatch(t)]
            if min_words <= len(tokens) <= max_words and len(words) >= 0.8 * len(tokens) and tokens[0][:1].isupper():
                found.append(tokens)
    return found


def swappable(tokens: list[str]) -> list[int]:
    """Positions i ≥ 1 where tokens i and i+1 are two different words (a swap there changes the sentence)."""
    return [i for i in range(1, len(tokens) - 1)
            if WORD.fullmatch(tokens[i]) and WORD.fullmatch(tokens[i + 1]) and tokens[i] != tokens[i + 1]]


@dataclass(frozen=True)
class ShiftExample:
    text: str
    label: int
    """1: two adjacent words swapped; 0: the sentence as written."""
    source: int
    """Index of the source sentence in the list given."""
    position: int | None
    """The swapped pair is (position, position + 1); None for an original."""


def bigram_shift_examples(sentences: list[list[str]], seed: int) -> list[ShiftExample]:
    """One example per usable sentence, labels balanced (half swapped; one more original when odd), by `seed`."""
    usable = [i for i, s in enumerate(sentences) if swappable(s)]
    rng = random.Random(seed)
    order = usable[:]
    rng.shuffle(order)
    examples = []
    for k, index in enumerate(order):
        tokens = list(sentences[index])
        if k % 2:
            position = rng.choice(swappable(tokens))
            tokens[position], tokens[position + 1] = tokens[position + 1], tokens[position]
            examples.append(ShiftExample(" ".join(tokens), 1, index, position))
        else:
            examples.append(ShiftExample(" ".join(tokens), 0, index, None))
    return examples


def corpus_sentences(corpus: Path, val_fraction: float, min_words: int = 6,
                     max_words: int = 30) -> dict[str, list[list[str]]]:
    """Distinct prose sentences of the corpus, by where the shard stage puts their document:
    `{"held-out": [...], "training": [...]}` (with `val_fraction` 0 every document is held out).

    `corpus`: JSONL records with a `text` field, or a text file with one document per line.
    """
    path = Path(corpus)
    if not path.is_file():
        raise PipelineError(f"--corpus {path}: file not found")
    seen: set[str] = set()
    found: dict[str, list[list[str]]] = {"held-out": [], "training": []}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                text = json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise PipelineError(f"{path}:{number}: expected a JSON object with a `text` field") from None
        else:
            text = line
        where = "held-out" if val_fraction <= 0 or held_out(text, val_fraction) else "training"
        for tokens in sentences_of(text, min_words, max_words):
            key = " ".join(tokens)
            if key not in seen:
                seen.add(key)
                found[where].append(tokens)
    return found


def held_out_sentences(corpus: Path, val_fraction: float, min_words: int = 6, max_words: int = 30) -> list[list[str]]:
    """Distinct prose sentences of the corpus documents the shard stage put in validation (all with fraction 0)."""
    return corpus_sentences(corpus, val_fraction, min_words, max_words)["held-out"]


TRAIN_FROM = ("held-out", "training")


def write_bigram_shift_task(corpus: Path, out: Path, *, seed: int = 1, val_fraction: float = 0.05,
                            dev_fraction: float = 0.25, max_examples: int | None = None,
                            train_from: str = "held-out", max_train: int | None = None) -> dict:
    """Write `out/train.jsonl` and `out/dev.jsonl` (`{"text", "label"}`, label 0 or 1), each balanced.

    `train_from="held-out"`: a held-out sentence goes to dev or train by a hash of its text.
    `train_from="training"`: dev is every held-out sentence and train the sentences of the documents
    the encoder pretrains on (a small corpus holds out too few sentences for both; the encoder has
    seen those sentences as text, never their labels, and dev stays unseen). Each split is labelled
    on its own, so both are balanced and no sentence is in both. `max_examples` caps the sentences
    read, `max_train` the train split.
    """
    if train_from not in TRAIN_FROM:
        raise PipelineError(f"--train-from {train_from!r}: expected one of {', '.join(TRAIN_FROM)}")
    if train_from == "training" and val_fraction <= 0:
        raise PipelineError("--train-from training needs --val-fraction > 0: with 0 every document is held out")
    found = corpus_sentences(corpus, val_fraction)
    held_out = found["held-out"][:max_examples] if max_examples is not None else found["held-out"]
    parts: dict[str, list[list[str]]] = {"train": [], "dev": []}
    if train_from == "training":
        parts["dev"] = held_out
        parts["train"] = found["training"][:max_examples] if max_examples is not None else found["training"]
    else:
        for tokens in held_out:
            digest = hashlib.blake2b(" ".join(tokens).encode(), digest_size=8, person=b"bigram-shift").digest()
            parts["dev" if int.from_bytes(digest, "big") / 2**64 < dev_fraction else "train"].append(tokens)
    if max_train is not None:
        parts["train"] = parts["train"][:max_train]
    counts = {}
    for offset, (name, part) in enumerate(parts.items()):
        examples = bigram_shift_examples(part, seed * 2 + offset)
        if len(examples) < 2:
            raise PipelineError(f"{corpus}: only {len(examples)} usable sentences for the {name} split; "
                                "use a larger corpus or another --val-fraction")
        lines = [json.dumps({"text": e.text, "label": e.label}) for e in examples]
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / f"{name}.jsonl", ("\n".join(lines) + "\n").encode())
        counts[name] = len(examples)
    return counts
