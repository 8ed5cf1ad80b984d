"""The embedding benchmark's fairness rules, without a model: a learning-rate grid is widened while its winner sits at
the edge of every rate tried, and the winning trial is carried into the next launch; texts are cut where every
tokenizer stops reading; the corpus stage draws equal shares of each source and holds out a seeded share; chains
start from corpus stages that the pool starts before them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules, as when run

from embedding_data import corpus_files, same_text  # noqa: E402
from embeddings import ARMS, reuse_chosen_trial, widened  # noqa: E402


@pytest.mark.parametrize(("tried", "chosen", "expected"), [
    ([1e-4, 3e-4, 1e-3], 1e-3, [1e-3, 3e-3]),
    ([1e-4, 3e-4, 1e-3], 1e-4, [3.33333e-5, 1e-4]),
    ([1e-4, 3e-4, 1e-3], 3e-4, None),
    ([1e-4, 3e-4, 1e-3, 1e-3 * 3.0], 1e-3, None),  # the winner of a widened round, inside every rate tried
    ([1e-4, 3e-4, 1e-3, 1e-3 * 3.0], 3e-3, [3e-3, 9e-3]),  # 0.0030000000000000005 and 0.003 are one rate
    ([1e-3], 1e-3, None),
])
def test_a_grid_is_widened_only_while_its_winner_sits_at_an_edge_of_every_rate_tried(tried, chosen, expected):
    assert widened(tried, chosen) == expected


def test_the_winning_trial_is_copied_into_the_next_launch_so_it_is_not_trained_again(tmp_path):
    previous, target = tmp_path / "lr1e-4_3e-4", tmp_path / "lr3e-4_0.0009"
    (previous / "selection" / "trial_b" / "seed_1").mkdir(parents=True)
    (previous / "selection" / "trial_b" / "seed_1" / "complete.json").write_text("{}")
    (previous / "selection" / "trial_a" / "seed_1").mkdir(parents=True)
    (previous / "selection.json").write_text(json.dumps({
        "chosen": {"train.learning_rate": "0.0003"},
        "trials": [{"trial": "a", "setting": {"train.learning_rate": "0.0001"}},
                   {"trial": "b", "setting": {"train.learning_rate": "0.0003"}}]}))
    reuse_chosen_trial(previous, target)
    assert [p.name for p in (target / "selection").iterdir()] == ["trial_b"]
    assert (target / "selection" / "trial_b" / "seed_1" / "complete.json").exists()


class WordTokenizer:
    """A tokenizer's call as the benchmark makes it: a token per word, plus two special tokens."""

    def __init__(self, per_word: int):
        self.per_word = per_word

    def __call__(self, text: str, truncation: bool) -> dict:
        return {"input_ids": [0] * (2 + self.per_word * len(text.split()))}


def test_a_text_is_cut_to_the_whole_words_that_every_tokenizer_reads():
    cut = same_text([WordTokenizer(1), WordTokenizer(2)], max_len=10)
    assert cut("one two three") == "one two three"  # 2 + 2·3 = 8 tokens: read whole by both
    assert cut("a b c d e f g h") == "a b c d"  # the second tokenizer reads 4 words within 10 tokens


def test_the_corpus_stage_draws_each_source_equally_and_holds_out_a_seeded_share(tmp_path):
    long = " ".join(["word"] * 20)
    sources = []
    for name, count in (("big", 40), ("small", 3)):
        sources.append(tmp_path / f"{name}.jsonl")
        sources[-1].write_text("".join(json.dumps({"text": f"{name} {i} {long}"}) + "\n" for i in range(count)))
    a = argparse.Namespace(corpus=[str(p) for p in sources], corpus_docs=10, corpus_held_out=0.25)
    articles = [{"title": "Super_Bowl_50", "paragraphs": [{"context": f"paragraph {i} {long}"} for i in range(2)]}]
    files = corpus_files(a, tmp_path / "data", lambda text: text, articles)
    rows = [json.loads(line) for key in ("corpus-train", "corpus-dev") for line in files[key].read_text().splitlines()]
    drawn = [r["text"].split()[0] for r in rows]
    assert drawn.count("big") == 5 and drawn.count("small") == 3  # equal shares; the small source gives all it has
    assert [r["title"] for r in rows if "title" in r] == ["Super Bowl 50"] * 2
    assert len(files["corpus-dev"].read_text().splitlines()) == 2  # a quarter of 10 documents, rounded
    assert files["corpus-dev"].read_text() == corpus_files(a, tmp_path / "again", lambda t: t,
                                                           articles)["corpus-dev"].read_text()


def test_every_chain_starts_from_a_corpus_stage_declared_before_it():
    names = list(ARMS)
    chains = [name for name, arm in ARMS.items() if arm.start in ARMS]
    assert chains == ["chain-export", "chain-scratch"]
    for name in chains:
        assert ARMS[ARMS[name].start].kind == "corpus"
        assert names.index(ARMS[name].start) < names.index(name)
    assert all(arm.grid for arm in ARMS.values() if arm.trains)
