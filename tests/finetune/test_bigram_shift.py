"""The bigram-shift task builder and the token-count baseline.

A swapped sentence has exactly the tokens of its source, so counting tokens must sit at chance on
the task; on a keyword task the same baseline must be near perfect.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from helpers import WORDS

from pipeline.common.errors import PipelineError
from pipeline.data.makers.bigram_shift import (
    bigram_shift_examples,
    held_out_sentences,
    sentences_of,
    swappable,
    write_bigram_shift_task,
)
from pipeline.data.shards.tokenize_worker import val_score
from pipeline.data.tasks.splits import load_custom
from pipeline.finetune.families.sequence.token_baseline import token_count_baseline


def random_sentences(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[rng.choice(WORDS).capitalize()] + [rng.choice(WORDS) for _ in range(rng.randint(5, 14))] + ["."]
            for _ in range(n)]


def test_labels_are_balanced_and_a_swapped_sentence_differs_by_one_adjacent_swap_of_two_words():
    sentences = random_sentences(501, 0) + [["Same", "same", "."], ["Only", "."]]  # the last two cannot be swapped
    examples = bigram_shift_examples(sentences, seed=3)
    assert len(examples) == 501 and {e.source for e in examples} == set(range(501))
    assert Counter(e.label for e in examples) == {0: 251, 1: 250}
    for e in examples:
        source, tokens = sentences[e.source], e.text.split(" ")
        assert Counter(tokens) == Counter(source)  # the same token multiset
        differing = [i for i, (a, b) in enumerate(zip(tokens, source, strict=True)) if a != b]
        if e.label == 0:
            assert differing == [] and e.position is None
        else:
            i = e.position
            assert differing == [i, i + 1] and tokens[i] == source[i + 1] and tokens[i + 1] == source[i]
            assert source[i] != source[i + 1] and i >= 1 and source[i + 1] != "."  # words only, never the first


def test_the_same_seed_gives_the_same_examples_and_another_seed_others():
    sentences = random_sentences(200, 1)
    assert bigram_shift_examples(sentences, 5) == bigram_shift_examples(sentences, 5)
    assert bigram_shift_examples(sentences, 5) != bigram_shift_examples(sentences, 6)


def test_prose_sentences_are_split_with_punctuation_apart_and_code_left_out():
    text = ("Return the value of the named attribute, if it exists. Otherwise raise an error!\n\n"
            "   x = getattr(obj, 'name')\n\nshort one.")
    assert sentences_of(text, min_words=4) == [
        ["Return", "the", "value", "of", "the", "named", "attribute", ",", "if", "it", "exists", "."],
        ["Otherwise", "raise", "an", "error", "!"]]  # no code line, no sentence starting in lower case
    assert sentences_of(text) == sentences_of(text, min_words=6)[:1]
    assert swappable(["A", "b", ",", "c", "d"]) == [3]


@pytest.fixture(scope="module")
def shift_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("shift")
    docs = [" ".join(" ".join(s) for s in random_sentences(12, seed)) for seed in range(300)]
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    counts = write_bigram_shift_task(corpus, root / "task", seed=1, val_fraction=0.0)
    return root, corpus, counts


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_task_files_are_balanced_disjoint_and_reproducible(shift_task, tmp_path):
    root, corpus, counts = shift_task
    train, dev = read(root / "task" / "train.jsonl"), read(root / "task" / "dev.jsonl")
    assert counts == {"train": len(train), "dev": len(dev)} and len(train) + len(dev) == 3600
    for rows in (train, dev):
        assert abs(sum(r["label"] for r in rows) - len(rows) / 2) <= 0.5
    assert 0.2 < len(dev) / 3600 < 0.3
    write_bigram_shift_task(corpus, tmp_path / "again", seed=1, val_fraction=0.0)
    assert (tmp_path / "again" / "train.jsonl").read_bytes() == (root / "task" / "train.jsonl").read_bytes()


def test_train_from_training_documents_keeps_every_held_out_sentence_for_dev(shift_task, tmp_path):
    _, corpus, _ = shift_task
    docs = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    counts = write_bigram_shift_task(corpus, tmp_path / "t", val_fraction=0.1, train_from="training", max_train=500)
    dev = {" ".join(sorted(r["text"].split())) for r in read(tmp_path / "t" / "dev.jsonl")}
    train = {" ".join(sorted(r["text"].split())) for r in read(tmp_path / "t" / "train.jsonl")}
    held = {" ".join(sorted(" ".join(s).split())) for d in docs if val_score(d) < 0.1 for s in sentences_of(d)}
    assert dev == held and counts == {"train": 500, "dev": len(held)}  # the whole held-out text, and no more
    assert not train & held  # train comes from the documents pretraining reads only
    with pytest.raises(PipelineError, match="--train-from training needs --val-fraction > 0"):
        write_bigram_shift_task(corpus, tmp_path / "u", val_fraction=0.0, train_from="training")


def test_only_the_shard_stages_validation_documents_are_used(shift_task):
    _, corpus, _ = shift_task
    docs = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    held = held_out_sentences(corpus, 0.1)
    kept = {" ".join(s) for d in docs if val_score(d) < 0.1 for s in sentences_of(d)}
    assert held and {" ".join(s) for s in held} == kept and len(held) < 3600 * 0.25


def test_a_token_count_model_is_at_chance_on_bigram_shift(shift_task):
    root, _, _ = shift_task
    data = load_custom(str(root / "task" / "train.jsonl"), str(root / "task" / "dev.jsonl"), None, ["text"], "label",
                       "classification", None)
    result = token_count_baseline(data)
    assert 0.43 <= result["accuracy"] <= 0.57, result


def test_the_token_count_baseline_solves_a_keyword_task(tmp_path):
    rng = random.Random(0)
    for name, n in (("train", 300), ("dev", 100)):
        rows = []
        for i in range(n):
            words = [rng.choice([w for w in WORDS if w != "river"]) for _ in range(6)]
            if i % 2:
                words[rng.randrange(6)] = "river"
            rows.append({"text": " ".join(words), "label": "yes" if i % 2 else "no"})
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_custom(str(tmp_path / "train.jsonl"), str(tmp_path / "dev.jsonl"), None, ["text"], "label",
                       "classification", None)
    result = token_count_baseline(data)
    assert result["accuracy"] >= 0.95 and set(result) == {"accuracy", "f1_macro"}


def test_the_baseline_command_reads_the_task_as_fine_tuning_does(shift_task, tmp_path, capsys):
    from pipeline.commands.token_baseline import main

    root, _, _ = shift_task
    config = {"task": "custom", "data": {"train_file": str(root / "task" / "train.jsonl"),
                                         "validation_file": str(root / "task" / "dev.jsonl"), "text_fields": ["text"]},
              "tracking": {"enabled": False}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = main(["--config", str(tmp_path / "config.json"), "--json", str(tmp_path / "baseline.json")])
    assert json.loads(capsys.readouterr().out) == result == json.loads((tmp_path / "baseline.json").read_text())
    assert result["baseline"] == "token counts" and result["task"] == "custom" and "accuracy" in result


def test_the_baseline_refuses_a_token_task():
    from pipeline.data.tasks.catalog import TaskSpec
    from pipeline.data.tasks.splits import TaskData
    from pipeline.data.tasks.token_files import TaggedSplit

    spec = TaskSpec("ner", ("tokens",), "tags", ("O", "B-LOC"), ("f1",))
    split = TaggedSplit("ner.conll", [["a"]], [["O"]], [1])
    with pytest.raises(PipelineError, match="not token tagging or QA"):
        token_count_baseline(TaskData(spec, split, {"dev": split}, {}))


def test_too_few_held_out_sentences_is_an_error(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": "Tiny."}) + "\n")
    with pytest.raises(PipelineError, match="usable sentences for the train split"):
        write_bigram_shift_task(corpus, tmp_path / "t", val_fraction=0.0)


def pair_task(tmp_path, task_type: str):
    """Pairs whose label is how much the second sentence repeats the first: a bag of both cannot see it."""
    rng = random.Random(1)
    for name, n in (("train", 400), ("dev", 200)):
        rows = []
        for i in range(n):
            first = [rng.choice(WORDS) for _ in range(8)]
            kept = rng.randint(0, 8) if task_type == "regression" else 8 * (i % 2)
            second = first[:kept] + [rng.choice(WORDS) for _ in range(8 - kept)]
            rng.shuffle(second)
            label = kept / 8 if task_type == "regression" else ("same" if kept else "other")
            rows.append({"a": " ".join(first), "b": " ".join(second), "label": label})
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_custom(str(tmp_path / "train.jsonl"), str(tmp_path / "dev.jsonl"), None, ["a", "b"], "label",
                       task_type, None)


def test_the_token_count_baseline_of_a_sentence_pair_sees_how_much_the_two_share(tmp_path):
    assert token_count_baseline(pair_task(tmp_path, "classification"))["accuracy"] >= 0.95


def test_a_similarity_regression_is_scored_from_the_overlap_of_its_pair(tmp_path):
    assert token_count_baseline(pair_task(tmp_path, "regression"))["pearson"] >= 0.8
