"""Minimal pairs from held-out text: one-word edits of real sentences, deterministic given the seed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import write_jsonl

from pipeline.commands.make.minimal_pairs import main
from pipeline.data.makers.minimal_pairs import make_pair, make_pairs, sentences_of

TEXT = ("The model is quiet. The tokens are seven in a batch. An encoder has read this document. "
        "These rivers were long and orange. Call f(x) = 3 here. Short one.")


def test_prose_sentences_are_kept_and_code_and_fragments_are_not():
    assert list(sentences_of(TEXT, min_words=4)) == [
        "The model is quiet.", "The tokens are seven in a batch.", "An encoder has read this document.",
        "These rivers were long and orange."]


@pytest.mark.parametrize("sentence, phenomenon, bad", [
    ("The model is quiet.", "agreement", "The model are quiet."),
    ("These rivers were long.", "agreement", None),  # two sites: checked below
    ("An encoder reads a document.", "determiner", None),
])
def test_each_edit_changes_exactly_one_word_to_its_partner(sentence, phenomenon, bad):
    pair = make_pair(sentence, phenomenon, np.random.default_rng(0))
    assert pair["sentence_good"] == sentence and pair["phenomenon"] == phenomenon
    good_words, bad_words = sentence.split(), pair["sentence_bad"].split()
    changed = [(g, b) for g, b in zip(good_words, bad_words, strict=True) if g != b]
    assert len(changed) == 1
    partners = {("these", "this"), ("were", "was"), ("is", "are"), ("an", "a"), ("a", "an")}
    assert (changed[0][0].lower().rstrip("."), changed[0][1].lower().rstrip(".")) in partners
    assert changed[0][1][0].isupper() == changed[0][0][0].isupper()  # the capital stays
    if bad:
        assert pair["sentence_bad"] == bad


def test_a_word_order_pair_swaps_two_adjacent_words_and_keeps_the_same_words():
    pair = make_pair("The encoder reads every document twice.", "word_order", np.random.default_rng(3))
    # The sentence's final stop stays at the end, whichever words move.
    assert pair["sentence_bad"].endswith(".")
    good, bad = pair["sentence_good"][:-1].split(), pair["sentence_bad"][:-1].split()
    assert sorted(good) == sorted(bad) and good != bad
    i = next(k for k in range(len(good)) if good[k] != bad[k])
    assert (bad[i], bad[i + 1]) == (good[i + 1], good[i]) and i >= 1  # never the capitalised first word


def test_a_sentence_without_an_edit_site_gives_no_pair():
    rng = np.random.default_rng(0)
    assert make_pair("Rivers run.", "agreement", rng) is None
    assert make_pair("Rivers run.", "determiner", rng) is None


def test_pairs_are_deterministic_given_the_seed_and_bounded_per_phenomenon():
    texts = [TEXT, "The batch is long. A token was masked in the corpus. The shards have an index."]
    first = make_pairs(texts, per_phenomenon=2, seed=1, min_words=4)
    assert first == make_pairs(texts, per_phenomenon=2, seed=1, min_words=4)
    counts = {p: sum(r["phenomenon"] == p for r in first) for p in ("agreement", "determiner", "word_order")}
    assert counts == {"agreement": 2, "determiner": 2, "word_order": 2}
    assert len({r["pair_id"] for r in first}) == len(first)
    assert all(r["sentence_good"] != r["sentence_bad"] for r in first)


def test_the_module_writes_pairs_from_the_held_out_documents_only(tmp_path, capsys):
    docs = [f"The model number {i} is quiet and reads a document." for i in range(200)]
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    main(["--input", str(corpus), "--out", str(tmp_path / "all.jsonl"), "--held-out-fraction", "1"])
    main(["--input", str(corpus), "--out", str(tmp_path / "held.jsonl"), "--held-out-fraction", "0.1"])
    from pipeline.data.shards.tokenize_worker import val_score

    held = [json.loads(line) for line in (tmp_path / "held.jsonl").read_text().splitlines()]
    every = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert 0 < len(held) < len(every)
    assert all(val_score(r["sentence_good"]) < 0.1 for r in held)  # one sentence per document here
    assert "pairs written to" in capsys.readouterr().out
