"""Exact deduplication: normalised-text hashes, first copy kept, counts in the index, the same across ranks."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import decode_documents, make_documents, write_jsonl
from tokenizers import Tokenizer

from pipeline.data.shards.exact_dedup import NO_TEXT, drop_mask, normalised_hash
from pipeline.data.shards.options import ShardOptions
from pipeline.data.shards.stage import run_shard_stage


def shard(inputs: tuple[str, ...], tokenizer, out, **overrides) -> dict:
    options = dict(inputs=inputs, tokenizer=str(tokenizer), seq_len=512, out=str(out), pack="doc", workers=1,
                   val_fraction=0.0, quiet=True)
    return run_shard_stage(ShardOptions(**{**options, **overrides}))


def test_the_hash_ignores_case_whitespace_and_unicode_compatibility_forms():
    base = normalised_hash("The file was found.")
    assert normalised_hash("  THE   file\twas\nfound. ") == base
    assert normalised_hash("The ﬁle was found.") == base  # NFKC: the "ﬁ" ligature is "fi"
    assert normalised_hash("The file was lost.") != base
    assert normalised_hash("") != int(NO_TEXT)


def test_a_record_is_dropped_when_its_text_came_earlier_in_this_rank_or_an_earlier_one():
    earlier = np.array([5, 7], np.uint64)
    mine = np.array([1, 7, 2, 1, 0, 0, 3], np.uint64)  # 0: a record without text, never a duplicate
    assert drop_mask([earlier, mine]).tolist() == [False, True, False, True, False, False, False]
    assert drop_mask([mine]).tolist() == [False, False, False, True, False, False, False]


@pytest.fixture(scope="module")
def duplicated_corpus(tmp_path_factory):
    """200 distinct documents and 30 copies (10 upper-cased, 10 re-spaced), over two files."""
    root = tmp_path_factory.mktemp("dedup")
    docs = make_documents(200, seed=9)
    copies = [docs[i] for i in range(0, 60, 2)]
    copies[:10] = [c.upper() for c in copies[:10]]
    copies[10:20] = ["  " + c.replace(" ", "   \t") + " " for c in copies[10:20]]
    files = [write_jsonl(root / "a.jsonl", docs[:100] + copies[:15]),
             write_jsonl(root / "b.jsonl", docs[100:] + copies[15:])]
    return {"files": files, "docs": docs, "copies": copies}


def test_known_duplicates_are_dropped_and_counted_with_their_tokens(tmp_path, duplicated_corpus, bpe_tokenizer_dir):
    inputs = tuple(map(str, duplicated_corpus["files"]))
    plain = shard(inputs, bpe_tokenizer_dir, tmp_path / "plain")
    assert plain["totals"]["documents"] == 230 and "duplicates" not in plain["totals"]
    index = shard(inputs, bpe_tokenizer_dir, tmp_path / "dedup", dedup="exact")
    tokenizer = Tokenizer.from_file(str(bpe_tokenizer_dir / "tokenizer.json"))
    copy_tokens = sum(len(tokenizer.encode(c, add_special_tokens=False).ids) for c in duplicated_corpus["copies"])
    assert index["totals"]["documents"] == 200
    assert index["totals"]["duplicates"] == {"documents": 30, "tokens": copy_tokens}
    assert index["args"]["dedup"] == "exact"
    kept = decode_documents(tmp_path / "dedup", "train", bpe_tokenizer_dir)
    assert kept == duplicated_corpus["docs"]  # the first copy of each, in input order


def test_ranks_drop_the_same_documents_as_one_process_whichever_runs_first(tmp_path, duplicated_corpus,
                                                                           bpe_tokenizer_dir):
    inputs = tuple(map(str, duplicated_corpus["files"]))
    for rank in (1, 0):  # rank 1 first: it hashes rank 0's records itself
        index = shard(inputs, bpe_tokenizer_dir, tmp_path / "ranks", rank=rank, world_size=2, dedup="exact")
    one = shard(inputs, bpe_tokenizer_dir, tmp_path / "one", dedup="exact")
    assert index["totals"]["duplicates"] == one["totals"]["duplicates"]
    assert index["totals"]["documents"] == 200
    kept = decode_documents(tmp_path / "ranks", "train", bpe_tokenizer_dir)
    assert sorted(kept) == sorted(duplicated_corpus["docs"])
    assert sorted(p.name for p in (tmp_path / "ranks" / "parts").glob("*.hashes.zst")) == \
        ["part00000.hashes.zst", "part00001.hashes.zst"]


def test_an_array_job_hashes_every_part_first_and_the_ranks_reuse_those_hashes(tmp_path, duplicated_corpus,
                                                                                bpe_tokenizer_dir):
    from pipeline.data.shards.stage import run_hash_pass

    inputs = tuple(map(str, duplicated_corpus["files"]))
    options = dict(inputs=inputs, tokenizer=str(bpe_tokenizer_dir), seq_len=512, out=str(tmp_path / "s"), pack="doc",
                   workers=1, val_fraction=0.0, quiet=True, dedup="exact", world_size=2)
    written = [run_hash_pass(ShardOptions(**options, rank=rank)) for rank in (0, 1)]
    stamps = [path.stat().st_mtime_ns for path in written]
    for rank in (1, 0):
        index = run_shard_stage(ShardOptions(**options, rank=rank))
    assert [path.stat().st_mtime_ns for path in written] == stamps  # each rank read only its own piece
    assert index["totals"]["duplicates"]["documents"] == 30
