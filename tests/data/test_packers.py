"""Packing modes: exact lengths, framing, nothing lost or duplicated, each row's documents, resumable state."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipeline.data.packers import DOCUMENT_COUNTS, DOCUMENT_KEYS, PACKERS, make_packer, take_rows, token_dtype

CLS, SEP, PAD = 0, 2, 1
SEQ_LEN = 16


def random_documents(n: int, seed: int = 0, max_len: int = 40) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # Ids from 5 up never collide with the special ids, as with encode_special_tokens=True.
    return [rng.integers(5, 1000, rng.integers(0, max_len)).astype(np.uint32) for _ in range(n)]


def feed(packer, docs: list[np.ndarray], batch: int = 7, keys: np.ndarray | None = None) -> dict[str, np.ndarray]:
    outs = []
    for i in range(0, len(docs), batch):
        group = docs[i: i + batch]
        outs.append(packer.add(np.concatenate(group), np.array([len(d) for d in group]),
                               None if keys is None else keys[i: i + batch]))
    outs.append(packer.finish())
    return {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}


def new(mode: str, seed: int = 0):
    return make_packer(mode, SEQ_LEN, CLS, SEP, PAD, np.uint16, seed=seed)


def test_full_sequences_are_exactly_seq_len_framed_and_give_back_the_documents_in_order():
    docs = random_documents(50)
    packer = new("full")
    out = feed(packer, docs)
    ids = out["input_ids"]
    assert ids.shape[1] == SEQ_LEN and ids.dtype == np.uint16
    assert (ids[:, 0] == CLS).all() and (ids[:, -1] == SEP).all()
    stream = ids[:, 1:-1].reshape(-1)
    expected = np.concatenate([np.append(d, SEP) for d in docs])
    # The bodies are the separator-joined documents, cut every seq_len - 2, minus the counted tail.
    assert np.array_equal(stream, expected[: len(stream)])
    tail = expected[len(stream):]
    assert len(tail) < SEQ_LEN - 2
    assert packer.stats.dropped_tokens == np.count_nonzero(tail != SEP)
    assert packer.stats.padding_tokens == 0
    assert packer.stats.document_tokens == sum(map(len, docs))


def test_doc_sequences_never_cross_a_document_and_padding_is_counted():
    docs = random_documents(50)
    packer = new("doc")
    out = feed(packer, docs)
    ids, length = out["input_ids"], out["length"]
    assert ids.shape[1] == SEQ_LEN and (ids[:, 0] == CLS).all()
    rebuilt, row = [], 0
    for doc in docs:
        pieces = []
        while sum(map(len, pieces)) < len(doc):
            n = length[row]
            assert ids[row, n - 1] == SEP and (ids[row, n:] == PAD).all()
            pieces.append(ids[row, 1: n - 1])
            row += 1
        rebuilt.append(np.concatenate(pieces) if pieces else doc[:0])
    assert row == len(ids)
    for doc, back in zip(docs, rebuilt, strict=True):
        assert np.array_equal(doc, back)
    assert packer.stats.padding_tokens == int((ids == PAD).sum()) > 0
    assert packer.stats.dropped_tokens == 0


def test_pairs_frame_two_segments_and_rebuild_each_document():
    docs = random_documents(300, max_len=60)
    packer = new("pairs")
    out = feed(packer, docs)
    ids, length, b_start, label = out["input_ids"], out["length"], out["segment_b_start"], out["nsp_label"]
    a_parts, b_parts = [], []
    for row in range(len(ids)):
        n, b = length[row], b_start[row]
        assert ids[row, 0] == CLS and ids[row, b - 1] == SEP and ids[row, n - 1] == SEP
        assert (ids[row, n:] == PAD).all() and b >= 3 and n - b >= 2  # A and B are non-empty
        a_parts.append(ids[row, 1: b - 1])
        b_parts.append(ids[row, b: n - 1])
    # A segments plus the true continuations (label 0) rebuild the documents in order.
    rebuilt = np.concatenate([np.concatenate([a, b]) if lab == 0 else a
                              for a, b, lab in zip(a_parts, b_parts, label, strict=True)])
    # Only 1-token leftovers at document ends are dropped, and they are counted.
    assert len(rebuilt) + packer.stats.dropped_tokens == sum(map(len, docs))
    assert packer.stats.dropped_tokens < len(docs)
    assert set(np.unique(label)) == {0, 1}
    assert 0.4 < label.mean() < 0.6


def test_pairs_random_segment_comes_from_another_document():
    docs = [np.full(30, 10 + i, np.uint32) for i in range(40)]  # each document is one repeated id
    out = feed(new("pairs"), docs)
    for ids, b, n, lab in zip(out["input_ids"], out["segment_b_start"], out["length"], out["nsp_label"], strict=True):
        a_id, b_ids = ids[1], set(ids[b: n - 1].tolist())
        assert (b_ids == {a_id}) == (lab == 0)


def row_documents(out: dict[str, np.ndarray]) -> list[list[int]]:
    bounds = np.concatenate([[0], np.cumsum(out[DOCUMENT_COUNTS])])
    return [out[DOCUMENT_KEYS][a:b].tolist() for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("mode", list(PACKERS))
def test_each_row_names_the_documents_whose_tokens_it_holds_in_the_order_they_appear(mode):
    rng = np.random.default_rng(4)
    # Document i is the id 10 + i repeated: a row's tokens say which documents it holds. Some are empty
    # (in no row), some span several rows.
    docs = [np.full(int(rng.integers(0, 40)), 10 + i, np.uint32) for i in range(120)]
    keys = (7 << 40) + 3 * np.arange(len(docs), dtype=np.int64)  # any int64 keys pass through as given
    out = feed(new(mode), docs, keys=keys)
    listed = row_documents(out)
    assert len(listed) == len(out["input_ids"])
    for ids, documents in zip(out["input_ids"], listed, strict=True):
        body = [int(t) for t in ids if t not in (CLS, SEP, PAD)]
        assert documents == [int(keys[t - 10]) for t, _ in itertools.groupby(body)]
    if mode == "full":  # rows joining documents: one row's last document is often the next row's first
        assert any(a[-1] == b[0] for a, b in itertools.pairwise(listed))
    if mode == "pairs":
        assert {len(d) for d in listed} == {1, 2}


def test_documents_default_to_their_numbers_in_the_stream_and_rows_are_cut_with_their_documents():
    docs = random_documents(40, seed=2)
    out = feed(new("full"), docs)
    listed = row_documents(out)
    assert listed[0][0] == 0 and max(max(d) for d in listed) < 40
    head, rest = take_rows(out, 5)
    assert row_documents(head) == listed[:5] and row_documents(rest) == listed[5:]
    assert len(head["input_ids"]) == 5 and len(rest["input_ids"]) == len(out["input_ids"]) - 5


@pytest.mark.parametrize("mode", list(PACKERS))
def test_state_round_trip_gives_the_same_sequences_as_one_pass(mode):
    docs = random_documents(60, seed=3)
    whole = feed(new(mode, seed=5), docs)
    first = new(mode, seed=5)
    head = first.add(np.concatenate(docs[:25]), np.array([len(d) for d in docs[:25]]))
    scalars, arrays = first.state()
    second = new(mode, seed=99)  # the seed must come back from the state
    second.load_state(scalars, arrays)
    rest = feed(second, docs[25:])
    for key in whole:
        assert np.array_equal(whole[key], np.concatenate([head[key], rest[key]])), key


def test_token_dtype_is_uint16_only_when_the_vocabulary_fits():
    assert token_dtype(50_265) == np.uint16 and token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32 and token_dtype(250_002) == np.uint32
