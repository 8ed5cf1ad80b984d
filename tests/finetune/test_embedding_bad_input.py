"""Bad input to the embedding stage is a clear error naming the file and line (or a counted warning), never a
traceback: a missing key, an empty text, a query with no positive, duplicate pairs, a score outside the declared
range, texts longer than the positions, a folder that is not a model."""

from __future__ import annotations

import json

import pytest

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.embedding_records import (
    count_truncated,
    read_labelled_pairs,
    read_pairs,
    read_scored_pairs,
    read_texts,
    warn_truncated,
)


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_missing_key_names_the_line_and_the_key(tmp_path):
    path = write(tmp_path / "sts.jsonl", [{"sentence1": "a cat", "sentence2": "a dog", "score": 1.0},
                                          {"sentence1": "a cat", "score": 2.0}])
    with pytest.raises(PipelineError, match=r"sts\.jsonl:2: no key 'sentence2'"):
        read_scored_pairs(path, (0, 5))


def test_an_empty_text_names_the_line(tmp_path):
    path = write(tmp_path / "texts.jsonl", [{"text": "a sentence"}, {"text": "   "}])
    with pytest.raises(PipelineError, match=r"texts\.jsonl:2: 'text' is an empty text"):
        read_texts(path)


def test_a_query_with_no_positive_names_the_line(tmp_path):
    path = write(tmp_path / "pairs.jsonl", [{"query": "q1", "positive": "d1"}, {"query": "q2", "positive": ""},
                                            {"query": "q3"}])
    with pytest.raises(PipelineError, match=r"pairs\.jsonl:2: the query has no positive"):
        read_pairs(path)
    write(path, [{"query": "q3", "negative": "d9"}])
    with pytest.raises(PipelineError, match=r"pairs\.jsonl:1: the query has no positive"):
        read_pairs(path)


def test_duplicate_pairs_are_dropped_and_counted(tmp_path, capsys):
    path = write(tmp_path / "pairs.jsonl", [{"query": "q1", "positive": "d1"}, {"query": "q2", "positive": "d2"},
                                            {"query": "q1", "positive": "d1"}, {"query": "q1", "positive": "d1"},
                                            {"query": "q1", "positive": "d1", "negative": "d2"}])
    split = read_pairs(path)
    assert split.texts == [("q1", "d1"), ("q2", "d2"), ("q1", "d1", "d2")]  # a hard negative makes another record
    assert "2 duplicate pairs dropped (the first at line 3); 3 kept" in capsys.readouterr().err


def test_a_score_outside_the_declared_range_names_the_line_and_the_range(tmp_path):
    path = write(tmp_path / "sts.jsonl", [{"sentence1": "a", "sentence2": "b", "score": 5.0},
                                          {"sentence1": "a", "sentence2": "c", "score": 5.5}])
    with pytest.raises(PipelineError, match=r"sts\.jsonl:2: score 5\.5 is outside the declared range \[0, 5\]"):
        read_scored_pairs(path, (0, 5))
    labelled = write(tmp_path / "pc.jsonl", [{"sentence1": "a", "sentence2": "b", "label": 2}])
    with pytest.raises(PipelineError, match=r"pc\.jsonl:1: label 2 must be 0 or 1"):
        read_labelled_pairs(labelled)


def test_texts_longer_than_the_positions_are_truncated_and_counted(bpe_tokenizer_dir, capsys):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    texts = ["the river", "the model reads a token " * 40, "a short one", "the batch of the corpus " * 40]
    assert count_truncated(tokenizer, texts, 16) == 2
    warn_truncated("dev.jsonl", 2, len(texts), 16)
    assert "dev.jsonl: 2 of 4 texts are longer than 16 tokens and were truncated" in capsys.readouterr().err


def test_a_folder_that_is_not_a_model_is_refused_by_every_command(tmp_path, capsys):
    from pipeline.commands.embed_eval import main as embed_eval
    from pipeline.commands.export import main as export

    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "readme.txt").write_text("not a model")
    pairs = write(tmp_path / "pairs.jsonl", [{"query": "q", "positive": "d"}])
    for command, argv in [(embed_eval, ["--model", str(folder), "--retrieval", str(pairs)]),
                          (export, ["--onnx", str(folder)])]:
        with pytest.raises(SystemExit) as stopped:
            command(argv)
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert f"{folder}: not a" in err and "model folder" in err and "Traceback" not in err
