"""Rank-local reading: the ranks' pieces are disjoint, cover every record, and each rank reads only its share."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest
from helpers import make_documents, write_jsonl

from pipeline.data.corpus import CorpusOptions, iter_record_batches, resolve_inputs
from pipeline.data.input_pieces import assign_inputs, iter_piece_batches
from pipeline.data.record_reader import ByteCounter

DEFAULTS = CorpusOptions()


def records_by_rank(inputs: list, world_size: int, options: CorpusOptions = DEFAULTS):
    """Each rank's raw records, and the bytes each rank read."""
    sources = resolve_inputs([str(p) for p in inputs])
    ranks, read = [], []
    for rank in range(world_size):
        counter = ByteCounter()
        pieces = assign_inputs(sources, rank, world_size)
        ranks.append([payload for batch in iter_piece_batches(pieces, options, rank, world_size, counter)
                      for payload in batch.payloads])
        read.append(counter.total)
    return ranks, read


def whole_corpus(inputs: list, options: CorpusOptions = DEFAULTS) -> list:
    sources = resolve_inputs([str(p) for p in inputs])
    return [payload for batch in iter_record_batches(sources, options) for payload in batch.payloads]


def assert_disjoint_cover(ranks: list[list], everything: list) -> None:
    together = Counter(record for rank in ranks for record in rank)
    assert together == Counter(everything)  # every record once: nothing lost, nothing read twice
    assert len(everything) == len(set(everything))  # (the records are distinct, so "once" is meaningful)


def awkward_text(n: int) -> str:
    """Documents separated by blank lines of every kind: several, whitespace-only, CRLF."""
    docs = make_documents(n, seed=3, max_words=40)
    separators = ["\n\n", "\n\n\n", "\n   \n", "\r\n\r\n", "\n\t\n\n"]
    out = []
    for i, doc in enumerate(docs):
        lines = doc.split(" mask ")  # some documents span several lines
        out.append("\n".join(lines) + separators[i % len(separators)])
    return "".join(out)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 7, 16])
def test_byte_ranges_of_one_jsonl_file_are_disjoint_and_cover_every_line(tmp_path, world_size):
    path = write_jsonl(tmp_path / "c.jsonl", make_documents(300, seed=1))
    ranks, read = records_by_rank([path], world_size)
    assert_disjoint_cover(ranks, whole_corpus([path]))
    size = path.stat().st_size
    assert max(read) <= size / world_size + 64 * 1024 + 4096  # a buffer's worth past its end, no more


@pytest.mark.parametrize("world_size", [2, 3, 4, 6, 9, 25])
def test_byte_ranges_of_blank_line_separated_text_cut_only_between_documents(tmp_path, world_size):
    path = tmp_path / "c.txt"
    path.write_bytes(awkward_text(120).encode())
    ranks, _ = records_by_rank([path], world_size)
    everything = whole_corpus([path])
    assert len(everything) == 120
    assert_disjoint_cover(ranks, everything)


def test_one_document_per_line_text_and_a_cut_inside_a_long_line(tmp_path):
    path = tmp_path / "lines.txt"
    docs = make_documents(40, seed=2)
    docs[20] = "long " * 5000  # longer than a piece: it belongs to the piece where it starts
    path.write_text("\n".join(docs) + "\n")
    options = CorpusOptions(one_doc_per_line=True)
    for world_size in (2, 3, 8, 40):
        ranks, _ = records_by_rank([path], world_size, options)
        assert_disjoint_cover(ranks, whole_corpus([path], options))


def test_many_files_go_whole_to_the_least_loaded_rank(tmp_path):
    paths = [write_jsonl(tmp_path / f"c{i}.jsonl", make_documents(10 + 20 * i, seed=i)) for i in range(7)]
    sources = resolve_inputs([str(p) for p in paths])
    assignment = [assign_inputs(sources, rank, 3) for rank in range(3)]
    assert all(piece.kind == "whole" for pieces in assignment for piece in pieces)
    assert sorted(p.source.path for pieces in assignment for p in pieces) == sorted(map(str, paths))
    loads = [sum(p.stat().st_size for p in paths if str(p) in {x.source.path for x in pieces})
             for pieces in assignment]
    assert max(loads) < 1.3 * sum(loads) / 3
    assert assignment == [assign_inputs(sources, rank, 3) for rank in range(3)]  # a pure function of the inputs
    ranks, read = records_by_rank(paths, 3)
    assert_disjoint_cover(ranks, whole_corpus(paths))
    assert read == loads  # each rank reads exactly its own files


def test_parquet_row_groups_are_shared_out(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": make_documents(100, seed=4)}), path, row_group_size=10)
    for world_size in (2, 3, 4, 12):
        ranks, _ = records_by_rank([path], world_size)
        assert_disjoint_cover(ranks, whole_corpus([path]))
    pieces = assign_inputs(resolve_inputs([str(path)]), 1, 4)
    assert [(p.kind, p.start, p.stop) for p in pieces] == [("row_groups", 2, 5)]


def test_a_compressed_single_file_is_read_by_every_rank_and_its_batches_are_dealt_out(tmp_path):
    plain = write_jsonl(tmp_path / "c.jsonl", make_documents(2000, seed=5))
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress(plain.read_bytes()))
    ranks, read = records_by_rank([path], 3)
    assert_disjoint_cover(ranks, whole_corpus([path]))
    assert all(r == path.stat().st_size for r in read)  # no way in but from the start: see input_pieces


def test_a_record_keeps_the_position_where_it_starts(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc{i}"}) + "\n" for i in range(10)))
    sources = resolve_inputs([str(path)])
    batches = list(iter_piece_batches(assign_inputs(sources, 1, 2), CorpusOptions(), 1, 2))
    assert batches[0].source.startswith(f"{path} (from byte ") and batches[0].lines[0] == 1
