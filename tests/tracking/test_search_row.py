"""The main job's search row: docstring search pairs from the corpus (first sentence → the rest), and the summary's
line with both arms zero-shot and fine-tuned beside BM25."""

from __future__ import annotations

import json

from pipeline.common.run_layout import MainJobLayout
from pipeline.data.makers.docstring_task import write_search_task
from pipeline.tracking.task_report import search_line


def test_each_docstrings_first_sentence_searches_for_the_rest_of_it(tmp_path):
    def body(i: int) -> str:
        return f"It reads file {i} line by line and returns every record it finds, in order."

    records = [{"kind": "docstring", "source": f"docstring:m.f{i}", "text": f"Parse record number {i}.\n\n{body(i)}"}
               for i in range(40)]
    records += [{"kind": "docstring", "source": "docstring:m.short", "text": "Too short. Two words."},
                {"kind": "topic", "source": "topic:x", "text": "A topic. " + body(0)}]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    counts = write_search_task(corpus, tmp_path / "search")
    rows = [json.loads(line) for name in ("train", "dev")
            for line in (tmp_path / "search" / f"{name}.jsonl").read_text().splitlines()]
    assert counts["train"] + counts["dev"] == 40 == len(rows) and counts["dev"] > 0  # no short body, no topic
    assert {"query": "Parse record number 7.", "positive": body(7)} in rows
    write_search_task(corpus, tmp_path / "again")
    assert (tmp_path / "again" / "dev.jsonl").read_text() == (tmp_path / "search" / "dev.jsonl").read_text()


def test_the_summary_line_sets_each_arm_zero_shot_and_fine_tuned_beside_bm25(tmp_path):
    layout = MainJobLayout(tmp_path)
    assert search_line(layout) is None  # not run: named nowhere, invented nowhere
    for arm, (zero, tuned) in {"pretrained": (0.12, 0.22), "from-scratch": (0.21, 0.37)}.items():
        folder = layout.finetune("search", arm).root
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({"ndcg_at_10": tuned, "zero_shot_ndcg_at_10": zero,
                                                         "bm25_ndcg_at_10": 0.619}))
    assert search_line(layout) == ("nDCG@10 (first sentence → the rest, dev docstrings), zero-shot → after one "
                                   "epoch: pretrained 0.120 → 0.220; from scratch 0.210 → 0.370; BM25 0.619")
