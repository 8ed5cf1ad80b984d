"""Pairs mined from a raw corpus (`embed-corpus`'s data): the sharder's formats read by its own reader, each view's
shape, mining fixed by its seed, and bad input as a clear error naming the file and line (or a counted warning)."""

from __future__ import annotations

import gzip

import pytest
from helpers import write_records

from pipeline.common.config.tree import SectionProblems
from pipeline.common.errors import PipelineError
from pipeline.data.tasks.corpus_documents import Document, read_documents
from pipeline.data.tasks.corpus_pairs import CorpusPairsConfig, mine_pairs

SENTENCES = ["the river runs past the old mill every spring", "a model reads each token of the corpus once",
             "the batch holds many short documents today", "every seed gives the same pairs again",
             "the loss compares each query with all passages"]


def document(i: int, sentences: int = 4) -> str:
    return ". ".join(f"doc{i} {SENTENCES[(i + k) % len(SENTENCES)]}" for k in range(sentences)) + "."



def test_the_sharders_formats_are_read_with_titles_where_the_input_has_them(tmp_path):
    records = [{"body": document(0), "title": "The mill"}, {"body": document(1)}]
    jsonl = write_records(tmp_path / "a.jsonl", records)
    gz = tmp_path / "b.txt.gz"
    gz.write_bytes(gzip.compress(f"# A heading\n{document(2)}\n\n{document(3)}\n".encode()))
    documents = read_documents([str(jsonl), str(gz)], text_key="body")
    assert [(d.title, d.where) for d in documents] == [("The mill", f"{jsonl}:1"), (None, f"{jsonl}:2"),
                                                       ("A heading", f"{gz}:1"), (None, f"{gz}:4")]
    assert documents[2].text == document(2)  # the heading is the title, the rest the text
    assert len(read_documents(str(tmp_path / "*.jsonl"), text_key="body")) == 2  # globs and folders, as shard.py


def test_each_view_pairs_a_document_with_itself(tmp_path):
    text = document(0, sentences=5)
    config = CorpusPairsConfig(crop_words=[4, 12])
    mined = mine_pairs([Document(text, "The mill", "corpus.jsonl:1")], config, "corpus.jsonl")
    pairs = dict(zip((key.rpartition("#")[2] for key in mined.split.ids), mined.split.texts, strict=True))
    assert set(pairs) == {"crops", "inverse_cloze", "title"}
    words = " ".join(text.split())
    for crop in pairs["crops"]:  # two spans of the document, each within the bounds
        assert crop in words and 4 <= len(crop.split()) <= 12
    assert pairs["crops"][0] != pairs["crops"][1]
    sentence, passage = pairs["inverse_cloze"]
    assert sentence.rstrip(".") in text and sentence not in passage and len(passage.split()) <= 12
    assert pairs["title"] == ("The mill", " ".join(text.split()[:12]))


def test_mining_is_fixed_by_its_seed_not_the_path_and_each_view_switches_on_alone():
    documents = [Document(document(i), None, f"c.jsonl:{i + 1}") for i in range(6)]
    first, again = (mine_pairs(documents, CorpusPairsConfig(seed=3), "c.jsonl").split.texts for _ in range(2))
    assert first == again != mine_pairs(documents, CorpusPairsConfig(seed=4), "c.jsonl").split.texts
    elsewhere = [Document(d.text, d.title, f"/another/checkout/{d.where}") for d in documents]
    assert mine_pairs(elsewhere, CorpusPairsConfig(seed=3), "c.jsonl").split.texts == first  # not the path's
    crops = mine_pairs(documents, CorpusPairsConfig(views=["crops"], seed=3), "c.jsonl").split
    assert all(key.endswith("#crops") for key in crops.ids)
    assert crops.texts == [pair for pair, key in zip(first, [f"c.jsonl:{i + 1}#{v}" for i in range(6)
                                                             for v in ("crops", "inverse_cloze")], strict=True)
                           if key.endswith("#crops")]  # a document's crops do not depend on the other views


def test_a_record_without_the_text_key_names_the_file_line_and_key(tmp_path):
    path = write_records(tmp_path / "corpus.jsonl", [{"text": document(0)}, {"body": document(1)}])
    with pytest.raises(PipelineError, match=r"corpus\.jsonl:2: no key 'text' \(keys: 'body'\); set "
                                            r"embedding\.corpus\.text_key"):
        read_documents(str(path))


def test_documents_too_short_are_skipped_and_counted_and_none_usable_is_an_error(capsys):
    documents = [Document(document(i), None, f"c.jsonl:{i + 1}") for i in range(3)]
    documents += [Document("too short to crop", None, f"c.jsonl:{i}") for i in (4, 5)]
    mined = mine_pairs(documents, CorpusPairsConfig(views=["crops"]), "c.jsonl")
    assert len(mined.split) == 3 and mined.skipped == {"crops": 2}
    assert "c.jsonl: documents skipped by a view: 2 had fewer than 16 words" in capsys.readouterr().err
    with pytest.raises(PipelineError, match=r"no pair could be mined from its 2 documents: 2 had fewer than 16 "
                                            r"words.*lower embedding\.corpus\.crop_words"):
        mine_pairs(documents[3:], CorpusPairsConfig(views=["crops", "title"]), "c.jsonl")


def test_every_problem_of_the_section_is_reported_at_once():
    with pytest.raises(SectionProblems) as err:
        CorpusPairsConfig(views=["crops", "summary"], crop_ratio=[0.6, 0.2], crop_words=[0, 8], text_key="")
    assert [p.split(":")[0] for p in err.value.problems] == [
        "embedding.corpus.views", "embedding.corpus.crop_ratio", "embedding.corpus.crop_words",
        "embedding.corpus.text_key"]
