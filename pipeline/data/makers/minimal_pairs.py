"""Minimal pairs made from held-out text: a grammatical sentence and the same sentence broken in one place.

    python data_prep/make_minimal_pairs.py --input corpus.jsonl --out pairs.jsonl [--per-phenomenon 200]

Three phenomena, each a one-word edit of a sentence taken as it is written (so the good sentence
is real text and only the bad one is made):
- `agreement`: a number-marked word swapped for its other number: is/are, was/were, has/have,
  does/do, this/these ("The values are kept." → "The values is kept.");
- `determiner`: a/an swapped ("an object" → "a object");
- `word_order`: two adjacent words swapped ("is kept in memory" → "is in kept memory").

Lines are the format the minimal-pair command reads (the public minimal-pair suites' format):
`{"sentence_good", "sentence_bad", "phenomenon", "rule", "pair_id"}`. Sentences are split at
`.`, `!` or `?` followed by a capital letter, and kept when they look like prose (letters, digits
and light punctuation only, `min_words` to `max_words` words): documentation code and tables do
not become pairs. The output is deterministic given the text and the seed: sentences are visited
in a seeded order and each edit site is chosen by a generator keyed by (seed, sentence).

Held out: with `--held-out-fraction F` (default: the shard stage's validation fraction) only the
documents the shard stage puts in its validation split are used (`held_out(text, F)`, the same
rule), so pairs come from text the model did not train on. `--held-out-fraction 1` uses all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

PHENOMENA = ("agreement", "determiner", "word_order")
AGREEMENT = {"is": "are", "was": "were", "has": "have", "does": "do", "this": "these"}
AGREEMENT.update({v: k for k, v in list(AGREEMENT.items())})
DETERMINERS = {"a": "an", "an": "a"}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_PROSE = re.compile(r"^[A-Z][A-Za-z0-9 ,;:'\-]*[A-Za-z0-9][.!?]$")
_WORD = re.compile(r"^[a-z]+$")


def sentences_of(text: str, min_words: int = 5, max_words: int = 20) -> Iterator[str]:
    """The prose sentences of a text, whitespace collapsed, `min_words` to `max_words` words long."""
    for piece in _SENTENCE_END.split(" ".join(text.split())):
        if _PROSE.match(piece) and min_words <= len(piece.split()) <= max_words:
            yield piece


def _with_case(word: str, like: str) -> str:
    return word.capitalize() if like[:1].isupper() else word


def _swap_word(words: list[str], table: dict[str, str], rng: np.random.Generator) -> tuple[list[str], str] | None:
    """Replace one word found in `table` (chosen by `rng`) by its partner; None when the sentence has none."""
    sites = [i for i, w in enumerate(words) if w.lower() in table]
    if not sites:
        return None
    i = int(sites[rng.integers(len(sites))])
    old = words[i]
    new = _with_case(table[old.lower()], old)
    return [*words[:i], new, *words[i + 1:]], f"{old.lower()} -> {new.lower()}"


def _swap_adjacent(words: list[str], rng: np.random.Generator) -> tuple[list[str], str] | None:
    """Swap two adjacent different lower-case words (not the first word, whose capital would give the swap away)."""
    sites = [i for i in range(1, len(words) - 1)
             if _WORD.match(words[i]) and _WORD.match(words[i + 1]) and words[i] != words[i + 1]]
    if not sites:
        return None
    i = int(sites[rng.integers(len(sites))])
    swapped = list(words)
    swapped[i], swapped[i + 1] = words[i + 1], words[i]
    return swapped, f"swap words {i + 1} and {i + 2}"


def make_pair(sentence: str, phenomenon: str, rng: np.random.Generator) -> dict | None:
    """One minimal pair of `phenomenon` from `sentence`, or None when the sentence offers no edit site."""
    words = sentence[:-1].split()  # the final . ! or ? is put back after the edit
    if phenomenon == "agreement":
        edit = _swap_word(words, AGREEMENT, rng)
    elif phenomenon == "determiner":
        edit = _swap_word(words, DETERMINERS, rng)
    elif phenomenon == "word_order":
        edit = _swap_adjacent(words, rng)
    else:
        raise ValueError(f"unknown phenomenon {phenomenon!r}; known: {', '.join(PHENOMENA)}")
    if edit is None:
        return None
    bad_words, rule = edit
    bad = " ".join(bad_words) + sentence[-1]
    return {"sentence_good": sentence, "sentence_bad": bad, "phenomenon": phenomenon, "rule": rule}


def make_pairs(texts: Iterable[str], per_phenomenon: int = 200, seed: int = 0, min_words: int = 5,
               max_words: int = 20, phenomena: tuple[str, ...] = PHENOMENA) -> list[dict]:
    """Up to `per_phenomenon` pairs of each phenomenon from the texts' sentences; deterministic given `seed`."""
    sentences = list(dict.fromkeys(s for text in texts for s in sentences_of(text, min_words, max_words)))
    order = np.random.default_rng(seed).permutation(len(sentences))
    made: dict[str, list[dict]] = {p: [] for p in phenomena}
    for index in order:
        rng = np.random.default_rng([seed, int(index)])
        for phenomenon in phenomena:
            if len(made[phenomenon]) < per_phenomenon:
                pair = make_pair(sentences[index], phenomenon, rng)
                if pair is not None:
                    pair["pair_id"] = f"{phenomenon}-{len(made[phenomenon])}"
                    made[phenomenon].append(pair)
        if all(len(v) >= per_phenomenon for v in made.values()):
            break
    return [pair for phenomenon in phenomena for pair in made[phenomenon]]


def held_out_texts(inputs: list[str], fraction: float, text_field: str = "text") -> Iterator[str]:
    """The documents of `inputs` that the shard stage puts in validation at `fraction` (all of them at 1)."""
    from pipeline.data.corpus import iter_texts, resolve_inputs
    from pipeline.data.corpus_types import CorpusOptions
    from pipeline.data.shards.tokenize_worker import held_out

    for text in iter_texts(resolve_inputs(inputs), CorpusOptions(text_field=text_field)):
        if fraction >= 1 or held_out(text, fraction):
            yield text


def write_pairs(path: str | Path, pairs: list[dict]) -> None:
    """Pairs as JSON lines, written atomically."""
    from pipeline.common.atomic_files import write_text_atomic

    write_text_atomic(path, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs))
