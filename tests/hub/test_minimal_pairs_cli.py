"""The minimal-pairs command: accuracy overall and per group, the unigram baseline, clear errors for bad files."""

from __future__ import annotations

import json

import pytest
from helpers import run_script

from pipeline.commands.minimal_pairs import main
from pipeline.common.errors import PipelineError
from pipeline.data.makers.minimal_pairs import make_pairs
from pipeline.hub.minimal_pairs import Pair, accuracy, pair_scores, read_pairs, summarize

TEXTS = ["The model is quiet and the river is long. The tokens are seven in a batch. An encoder has read this "
         "document. These rivers were long and orange. The corpus was read by a model in an hour."]


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    pairs = make_pairs(TEXTS, per_phenomenon=3, seed=0, min_words=4)
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps({**p, "UID": f"u{i % 2}"}) + "\n" for i, p in enumerate(pairs)))
    return path, pairs


def test_accuracy_counts_good_above_bad_and_a_tie_as_half():
    assert accuracy([(-1.0, -2.0), (-3.0, -2.0), (-1.0, -1.0), (-0.5, -4.0)]) == {
        "accuracy": 2.5 / 4, "pairs": 4, "good_higher": 2, "ties": 1}
    pairs = [Pair("a", "b", "x"), Pair("c", "d", "y"), Pair("e", "f", "x")]
    summary = summarize(pairs, [(0.0, -1.0), (0.0, -1.0), (-1.0, 0.0)])
    assert summary["groups"]["x"]["accuracy"] == 0.5 and summary["groups"]["y"]["accuracy"] == 1.0


def test_each_distinct_sentence_is_scored_once():
    calls = []

    def score(sentences):
        calls.append(list(sentences))
        return [float(len(s)) for s in sentences]

    scored = pair_scores([Pair("aa", "b", None), Pair("aa", "ccc", None)], score)
    assert scored == [(2.0, 1.0), (2.0, 3.0)] and calls == [["aa", "b", "ccc"]]


def test_the_command_reports_groups_and_the_unigram_baseline(tmp_path, pairs_file, roberta_export, corpus_jsonl,
                                                            capsys):
    path, pairs = pairs_file
    out = tmp_path / "result.json"
    main(["--model", str(roberta_export), "--pairs", str(path), "--group-by", "phenomenon",
          "--corpus", str(corpus_jsonl), "--out", str(out)])
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["model_scores"]["overall"]["pairs"] == len(pairs)
    groups = result["model_scores"]["groups"]
    assert set(groups) == {"agreement", "determiner", "word_order"}
    assert sum(g["pairs"] for g in groups.values()) == len(pairs)
    # A unigram model cannot see word order: every word-order pair is a tie, so it sits at chance.
    unigram = result["unigram_scores"]["groups"]["word_order"]
    assert unigram["ties"] == unigram["pairs"] and unigram["accuracy"] == 0.5
    assert result["corpus_tokens"] > 0 and result["pairs_per_second"] > 0
    assert "word_order" in printed and "pairs/s" in printed
    # The figures are those of Encoder.score itself.
    from pipeline.hub.encoder import Encoder

    encoder = Encoder.from_pretrained(roberta_export)
    good, bad = encoder.score([pairs[0]["sentence_good"], pairs[0]["sentence_bad"]])
    first = summarize([Pair(pairs[0]["sentence_good"], pairs[0]["sentence_bad"], None)], [(good, bad)])
    single = tmp_path / "one.jsonl"
    single.write_text(json.dumps(pairs[0]) + "\n")
    main(["--model", str(roberta_export), "--pairs", str(single), "--precision", "fp32",
          "--out", str(tmp_path / "one.json")])
    written = json.loads((tmp_path / "one.json").read_text())
    assert written["model_scores"] == first and written["precision"] == "fp32"


def test_group_by_any_field_of_the_suite(pairs_file, roberta_export, tmp_path):
    path, _ = pairs_file
    main(["--model", str(roberta_export), "--pairs", str(path), "--group-by", "UID", "--out", str(tmp_path / "r.json")])
    assert set(json.loads((tmp_path / "r.json").read_text())["model_scores"]["groups"]) == {"u0", "u1"}


@pytest.mark.parametrize("lines, message", [
    (['{"sentence_good": "A b.", "sentence_bad": "B a."}', '{"sentence_good": "A b."}'],
     r"pairs.jsonl:2: 'sentence_bad' must be a non-empty string \(no such field\)"),
    (['{"sentence_good": "A b.", "sentence_bad": "B a."}', "", '{"sentence_good": "A b.", "sentence_bad": '],
     r"pairs.jsonl:3: invalid JSON"),
    (['["A b.", "B a."]'], r"pairs.jsonl:1: expected a JSON object"),
    (['{"sentence_good": "A b.", "sentence_bad": ""}'], r"pairs.jsonl:1: 'sentence_bad' must be a non-empty"),
])
def test_a_bad_line_is_an_error_naming_file_and_line(tmp_path, lines, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PipelineError, match=message):
        read_pairs(path)


def test_a_missing_group_field_names_the_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"sentence_good": "A b.", "sentence_bad": "B a.", "UID": "x"}\n'
                    '{"sentence_good": "A b.", "sentence_bad": "B a."}\n')
    with pytest.raises(PipelineError, match=r"pairs.jsonl:2: no field 'UID' to group by"):
        read_pairs(path, group_by="UID")


def test_the_launcher_refuses_a_model_without_an_mlm_head_by_name(tmp_path, pairs_file, finetuned_rte):
    path, _ = pairs_file
    proc = run_script("launchers/minimal_pairs.py", "--model", finetuned_rte["dir"], "--pairs", path)
    assert proc.returncode != 0
    assert "pseudo-log-likelihood scoring needs a masked-LM head" in proc.stderr
    assert "Traceback" not in proc.stderr
