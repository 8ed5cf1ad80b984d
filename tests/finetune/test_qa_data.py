"""Extractive QA: SQuAD/JSONL readers and their errors, windows through the offset mapping, answers, EM/F1."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.qa_files import QAExample, read_qa
from pipeline.finetune.families.metrics import answer_f1, normalize_answer, squad_metrics
from pipeline.models.spans.qa_windows import best_answers, encode_qa

CONTEXT = "The river flows quietly past the mountain. Seven orange tensors sit by the river bank."


def squad(questions: list[dict], context: str = CONTEXT, version: str = "1.1") -> dict:
    return {"version": version, "data": [{"title": "t", "paragraphs": [{"context": context, "qas": questions}]}]}


@pytest.fixture(params=["bpe", "wordpiece"])
def tokenizer(request, bpe_tokenizer_dir, wordpiece_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bpe_tokenizer_dir if request.param == "bpe" else wordpiece_tokenizer_dir)


def test_squad_v1_v2_and_jsonl_read_the_same_questions(tmp_path):
    start = CONTEXT.index("Seven orange tensors")
    qas = [{"id": "q1", "question": "  What sits by the bank?", "answers": [
        {"text": "Seven orange tensors", "answer_start": start}, {"text": "tensors", "answer_start": start + 13}]},
        {"id": "q2", "question": "Who sings?", "answers": [], "is_impossible": True}]
    (tmp_path / "dev.json").write_text(json.dumps(squad(qas, version="v2.0"), indent=1))
    split = read_qa(tmp_path / "dev.json")
    assert [e.id for e in split.examples] == ["q1", "q2"] and split.has_unanswerable
    assert split.examples[0].question == "What sits by the bank?"
    assert split.golds() == {"q1": ["Seven orange tensors", "tensors"], "q2": []}
    rows = [{"id": q["id"], "context": CONTEXT, "question": q["question"],
             "answers": {"text": [a["text"] for a in q["answers"]],
                         "answer_start": [a["answer_start"] for a in q["answers"]]}} for q in qas]
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_qa(tmp_path / "dev.jsonl").examples == split.examples


def test_bad_squad_input_names_the_file_and_line(tmp_path):
    good = {"id": "ok", "question": "What flows?", "answers": [{"text": "river", "answer_start": 4}]}
    bad = {"id": "bad", "question": "What flows?", "answers": [{"text": "river", "answer_start": 5}]}
    (tmp_path / "train.json").write_text(json.dumps(squad([good, bad]), indent=1))
    line = next(i for i, text in enumerate((tmp_path / "train.json").read_text().splitlines(), 1) if '"bad"' in text)
    with pytest.raises(PipelineError, match=rf"train.json:{line} .*id bad\): answer 'river' does not match the context "
                                            r"at answer_start 5 \(the context there reads 'iver flows q"):
        read_qa(tmp_path / "train.json")
    (tmp_path / "empty.jsonl").write_text(json.dumps({"id": "a", "context": "x", "question": "q?",
                                                      "answers": {"text": [], "answer_start": []}}) + "\n"
                                          + json.dumps({"id": "b", "context": "  ", "question": "q?",
                                                        "answers": {"text": [], "answer_start": []}}) + "\n")
    with pytest.raises(PipelineError, match=r"empty.jsonl:2: the context is empty"):
        read_qa(tmp_path / "empty.jsonl")


def test_answer_tokens_cover_the_answer_in_every_window_that_holds_it(tokenizer):
    context = " ".join(["the river flows quietly past the mountain ."] * 12) + " Seven orange tensors sit here ."
    start = context.index("Seven orange tensors")
    examples = [QAExample("q", "What sits here?", context, ["Seven orange tensors"], [start]),
                QAExample("short", "What flows?", "The river flows.", ["river"], [4])]
    windows = encode_qa(tokenizer, examples, max_seq_len=48, doc_stride=16)
    assert windows.split_contexts == 1 and max(map(len, windows.input_ids)) <= 48
    holding = [k for k in range(len(windows)) if windows.start_positions[k] > 0]
    assert windows.example.count(0) > 2 and windows.example.count(1) == 1
    assert windows.answer_outside == len(windows) - len(holding) and len(holding) >= 2
    for k in holding:
        s, e = windows.start_positions[k], windows.end_positions[k]
        text = examples[windows.example[k]].context[windows.offsets[k][s][0]:windows.offsets[k][e][1]]
        assert normalize_answer(text) == normalize_answer(examples[windows.example[k]].answers[0])
    # Logits that point at the labelled span in one window give back the answer text across all windows.
    starts, ends = [], []
    for k in range(len(windows)):
        s, e = np.zeros(len(windows.input_ids[k]) + 5), np.zeros(len(windows.input_ids[k]) + 5)  # + padding
        if windows.start_positions[k] > 0:
            s[windows.start_positions[k]], e[windows.end_positions[k]] = 5.0, 5.0
        starts.append(s)
        ends.append(e)
    answers = best_answers(examples, windows, starts, ends)
    assert squad_metrics(answers, {e.id: e.answers for e in examples})["exact_match"] == 100.0


def test_no_answer_wins_only_past_the_threshold(tokenizer):
    examples = [QAExample("q", "What flows?", CONTEXT, [], [])]
    windows = encode_qa(tokenizer, examples, max_seq_len=64, doc_stride=16)
    assert windows.start_positions == [0] and windows.end_positions == [0]
    first = windows.offsets[0].index(next(o for o in windows.offsets[0] if o is not None))
    starts, ends = np.zeros(64), np.zeros(64)
    starts[0] = ends[0] = 2.0  # null score 4
    starts[first] = ends[first] = 1.5  # best span 3
    kwargs = {"allow_no_answer": True}
    assert best_answers(examples, windows, [starts], [ends], **kwargs, null_threshold=0.0) == {"q": ""}
    assert best_answers(examples, windows, [starts], [ends], **kwargs, null_threshold=1.5)["q"] != ""
    assert best_answers(examples, windows, [starts], [ends])["q"] != ""  # SQuAD 1.1: always an answer


def test_max_answer_length_is_counted_in_tokens(wordpiece_tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(wordpiece_tokenizer_dir)
    examples = [QAExample("q", "What flows?", "river flows quietly past the mountain", [], [])]
    windows = encode_qa(tokenizer, examples, max_seq_len=64, doc_stride=16)
    inside = [i for i, o in enumerate(windows.offsets[0]) if o is not None]
    starts, ends = np.zeros(64), np.zeros(64)
    starts[inside[0]], ends[inside[-1]] = 9.0, 9.0  # the whole 6-token context
    ends[inside[1]] = 8.0
    assert best_answers(examples, windows, [starts], [ends])["q"] == "river flows quietly past the mountain"
    assert best_answers(examples, windows, [starts], [ends], max_answer_length=2)["q"] == "river flows"


def test_exact_match_and_f1_follow_the_official_normalisation():
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert answer_f1("Broncos", "Denver Broncos") == pytest.approx(2 / 3)
    golds = {"a": ["Denver Broncos", "the Broncos"], "b": ["in 1990"], "c": []}
    predictions = {"a": "broncos.", "b": "1990 and 1991", "c": ""}
    metrics = squad_metrics(predictions, golds)
    # By hand: a → EM 1 ("broncos" = "the Broncos" normalised); b → F1 2·(1/3)·(1/2)/(1/3+1/2) = 0.4; c → no-answer hit.
    assert metrics["exact_match"] == pytest.approx(100 * 2 / 3)
    assert metrics["f1"] == pytest.approx(100 * (1 + 0.4 + 1) / 3)
    with pytest.raises(ValueError, match="no prediction"):
        squad_metrics({"a": "x"}, golds)
