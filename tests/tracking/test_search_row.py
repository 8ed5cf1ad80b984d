"""The main job's search rows: docstring search pairs from the corpus (first sentence → the rest), and the summary's
dense, sparse and hybrid lines with both arms beside BM25."""

from __future__ import annotations

import json

from helpers import write_records

from pipeline.common.run_layout import MainJobLayout
from pipeline.data.makers.docstring_task import write_search_task
from pipeline.tracking.task_report import search_lines


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


def test_the_summary_sets_each_arms_dense_sparse_and_hybrid_search_beside_bm25(tmp_path):
    layout = MainJobLayout(tmp_path)
    assert search_lines(layout) == []  # not run: named nowhere, invented nowhere
    for arm, (zero, tuned) in {"pretrained": (0.32, 0.52), "from-scratch": (0.21, 0.37)}.items():
        folder = layout.finetune("search", arm).root
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({"ndcg_at_10": tuned, "zero_shot_ndcg_at_10": zero,
                                                         "bm25_ndcg_at_10": 0.619}))
    assert search_lines(layout) == [("search, dense", (
        "nDCG@10 (first sentence → the rest, dev docstrings) after a contrastive stage on the corpus (no labels) → "
        "after one epoch of pairs: pretrained 0.320 → 0.520; from scratch 0.210 → 0.370; BM25 0.619"))]
    for arm, figure in {"pretrained": 0.3, "from-scratch": 0.1}.items():
        folder = layout.finetune("search-sparse", arm).root
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({"ndcg_at_10": figure, "document_active_dims": 180.4}))
        dense = layout.finetune("search", arm).metrics
        dense.write_text(json.dumps({**json.loads(dense.read_text()), "hybrid_ndcg_at_10": figure + 0.4,
                                     "hybrid_weight": 0.6}))
    sparse, hybrid = search_lines(layout)[1:]
    assert sparse == ("search, sparse", "SPLADE from each arm's masked-LM head: pretrained 0.300 (180 active "
                                        "dimensions per document); from scratch 0.100 (180 active dimensions per "
                                        "document)")
    assert hybrid == ("search, hybrid", "dense + BM25, the weight chosen on held-out queries: pretrained 0.700 "
                                        "(weight 0.6); from scratch 0.500 (weight 0.6)")


def test_the_corpus_stage_trains_on_the_documents_pretraining_reads_and_selects_on_those_it_holds_out(tmp_path):
    from pipeline.data.makers.docstring_task import write_document_split
    from pipeline.data.shards.tokenize_worker import held_out

    texts = [f"Document {i} says something of its own, at some length." for i in range(200)]
    corpus = write_records(tmp_path / "corpus.jsonl", [{"kind": "topic", "text": t} for t in texts])
    counts = write_document_split(corpus, tmp_path / "documents", 0.1)
    dev = [json.loads(line)["text"] for line in (tmp_path / "documents" / "dev.jsonl").read_text().splitlines()]
    train = [json.loads(line)["text"] for line in (tmp_path / "documents" / "train.jsonl").read_text().splitlines()]
    assert sorted(dev + train) == sorted(texts) and counts == {"train": len(train), "dev": len(dev)}
    assert dev == [t for t in texts if held_out(t, 0.1)] and 0 < len(dev) < 60  # the shard stage's own rule
