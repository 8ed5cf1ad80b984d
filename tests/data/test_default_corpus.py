"""The embedded default corpus exists offline and is real prose from Python itself."""

from __future__ import annotations

import json

import pytest
from helpers import run_script

from pipeline.data.makers.default_corpus import iter_docstring_records, iter_topic_records


def test_documentation_topics_and_docstrings_are_both_present_and_substantial():
    topics = list(iter_topic_records())
    assert len(topics) > 50 and all(r["kind"] == "topic" and r["text"].strip() for r in topics)
    assert any(r["source"] == "topic:assert" for r in topics)
    docstrings = list(iter_docstring_records())
    assert len(docstrings) > 500 and all(len(r["text"]) >= 200 for r in docstrings)
    assert not any(".test." in r["source"] or r["source"].startswith("docstring:test.") for r in docstrings)


@pytest.mark.slow  # the main job's data stage end to end: corpus, an 8k tokenizer, shards, verification
def test_main_job_builds_corpus_tokenizer_and_verified_shards(tmp_path):
    """The main job's data steps (the training steps are tested on their own, and run by demo.sh)."""
    proc = run_script("launchers/run_default.py", "--out", tmp_path, "--workers", "2", "--stop-after", "verify",
                      check=True)
    assert "main job stopped after the data stage" in proc.stdout and f"{tmp_path / 'shards'}: OK" in proc.stdout
    first_line = json.loads((tmp_path / "corpus.jsonl").open().readline())
    assert set(first_line) == {"text", "source", "kind"}
    index = json.loads((tmp_path / "shards" / "index.json").read_text())
    assert index["splits"]["train"]["sequences"] > 1000 and index["splits"]["val"]["sequences"] > 0
    assert "wrote" in (tmp_path / "logs" / "shards.log").read_text()  # each stage's full output is kept
    again = run_script("launchers/run_default.py", "--out", tmp_path, "--stop-after", "verify", check=True)
    assert "already complete" in again.stderr + again.stdout
    timings = json.loads((tmp_path / "logs" / "timings.json").read_text())
    assert timings["order"] == ["shards", "verify"]  # the rerun skipped the corpus and the tokenizer
    assert set(timings["stages_s"]) == {"shards", "verify"}
