"""Pack tokenized documents into fixed-length sequences: RoBERTa's FULL- and DOC-SENTENCES, BERT's pairs.

Packers are pure state machines over a stream of documents (no I/O). Each call to `add` takes a
batch of documents as one flat token array plus per-document lengths (and optionally one int64
key per document, naming where it came from), and returns the sequences completed so far as a
dict of arrays with one row per sequence. `state()` / `from_state()` capture everything needed to
carry on exactly, so the shard stage can resume mid-corpus.

Sequence fields:
- `input_ids` (n, seq_len): the tokens, framed `<s> … </s>` (`[CLS] … [SEP]`), padded with pad.
- `length` (n,): tokens before the padding (doc and pairs modes; full sequences are all seq_len).
- `segment_b_start` (n,): position of segment B's first token (pairs mode).
- `nsp_label` (n,): 0 when B continues A, 1 when B comes from another document (pairs mode;
  the convention of `BertForPreTraining.next_sentence_label`).
- `doc_starts` (n, max_docs): where each document of the row begins, then -1 (doc-packed mode).

Which documents each sequence holds (every mode), in the order their tokens appear in it, as a
ragged list: `document_counts` (n,) documents per row, and `document_keys`, the rows' document
keys one after the other (not one row per sequence: cut rows with `take_rows`). A document counts
where at least one of its tokens is in the row: a FULL-SENTENCES row can hold the tail of one
document and the start of others, a pairs row holds B's document too when B comes from another.
These two are not shard fields; the shard writer stores them beside the shard.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

PackMode = Literal["full", "doc", "doc-packed", "pairs"]
Sequences = dict[str, np.ndarray]
DOCUMENT_COUNTS = "document_counts"
DOCUMENT_KEYS = "document_keys"
DOCUMENT_FIELDS = (DOCUMENT_COUNTS, DOCUMENT_KEYS)


def take_rows(seqs: Sequences, n: int) -> tuple[Sequences, Sequences]:
    """The first `n` rows of `seqs` and the rest (the ragged `document_keys` cut where its rows end)."""
    cut = int(seqs[DOCUMENT_COUNTS][:n].sum()) if DOCUMENT_COUNTS in seqs else 0
    head = {k: v[:cut] if k == DOCUMENT_KEYS else v[:n] for k, v in seqs.items()}
    rest = {k: v[cut:] if k == DOCUMENT_KEYS else v[n:] for k, v in seqs.items()}
    return head, rest


def _ragged(keys: list[list[int]]) -> dict[str, np.ndarray]:
    """Per-row key lists → the two document fields."""
    counts = np.fromiter((len(row) for row in keys), np.int32, len(keys))
    flat = np.fromiter((k for row in keys for k in row), np.int64, int(counts.sum()))
    return {DOCUMENT_COUNTS: counts, DOCUMENT_KEYS: flat}


@dataclass
class PackStats:
    """Counters of one packer; `tokens` counts every non-pad token written, framing included."""

    documents: int = 0
    document_tokens: int = 0
    sequences: int = 0
    tokens: int = 0
    padding_tokens: int = 0
    dropped_tokens: int = 0
    """Document tokens not written: the final partial sequence in `full` mode, 1-token leftovers in `pairs`."""

    def merge(self, other: PackStats) -> None:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)


class Packer:
    """Base class: bookkeeping shared by the three modes."""

    mode: PackMode
    fields: tuple[str, ...] = ("input_ids",)

    def __init__(self, seq_len: int, cls_id: int, sep_id: int, pad_id: int, dtype: np.dtype):
        if seq_len < 8:
            raise ValueError(f"seq_len must be at least 8, got {seq_len}")
        self.seq_len = seq_len
        self.cls_id, self.sep_id, self.pad_id = cls_id, sep_id, pad_id
        self.dtype = np.dtype(dtype)
        self.stats = PackStats()

    def add(self, ids: np.ndarray, lengths: np.ndarray, keys: np.ndarray | None = None) -> Sequences:
        """Consume documents (flat `ids`, split by `lengths`); return the sequences completed.

        `keys`: one int64 per document, reported back in `document_keys`; by default the documents'
        numbers in the stream (0, 1, 2, ... over all calls).
        """
        if keys is None:
            keys = np.arange(self.stats.documents, self.stats.documents + len(lengths), dtype=np.int64)
        self.stats.documents += len(lengths)
        self.stats.document_tokens += int(lengths.sum())
        out = self._add(ids, lengths, np.asarray(keys, np.int64))
        self._count(out)
        return out

    def finish(self) -> Sequences:
        """Flush at the end of the corpus; returns any last sequences."""
        out = self._finish()
        self._count(out)
        return out

    def _count(self, out: Sequences) -> None:
        n = len(out["input_ids"])
        self.stats.sequences += n
        real = int(out["length"].sum()) if "length" in out else n * self.seq_len
        self.stats.tokens += real
        self.stats.padding_tokens += n * self.seq_len - real

    def empty(self) -> Sequences:
        out = {name: np.zeros((0, *self._row_shape(name)), self._dtype_of(name)) for name in self.fields}
        return {**out, **_ragged([])}

    def _row_shape(self, name: str) -> tuple[int, ...]:
        return (self.seq_len,) if name == "input_ids" else ()

    def _dtype_of(self, name: str) -> np.dtype:
        return self.dtype if name == "input_ids" else np.dtype(np.int32 if name != "nsp_label" else np.int8)

    def _finish(self) -> Sequences:
        return self.empty()

    # State: JSON-able scalars plus named arrays.
    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        return {"stats": asdict(self.stats)}, {}

    def load_state(self, scalars: dict, arrays: dict[str, np.ndarray]) -> None:
        self.stats = PackStats(**scalars["stats"])


class FullPacker(Packer):
    """FULL-SENTENCES (Liu et al. 2019, §4.2): documents joined by a separator, cut every seq_len - 2.

    Every sequence is exactly `seq_len` tokens, `<s>` + body + `</s>`; bodies may cross document
    boundaries. The final partial body is dropped at `finish` and counted in `dropped_tokens`.
    """

    mode = "full"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.body = self.seq_len - 2
        self.carry = np.zeros(0, self.dtype)
        self.carry_keys = np.zeros(0, np.int64)
        """Keys of the documents with tokens in `carry`, in order."""
        self.carry_spans = np.zeros((0, 2), np.int64)
        """Where each of those documents' tokens lie in `carry` (start, end)."""

    def _add(self, ids: np.ndarray, lengths: np.ndarray, keys: np.ndarray) -> Sequences:
        # One separator after every document, inserted in one vectorised call.
        stream = np.insert(ids.astype(self.dtype, copy=False), np.cumsum(lengths), self.sep_id)
        stream = np.concatenate([self.carry, stream])
        n = len(stream) // self.body
        documents = self._documents(lengths, keys, n)
        self.carry = stream[n * self.body:].copy()
        seqs = np.empty((n, self.seq_len), self.dtype)
        seqs[:, 0] = self.cls_id
        seqs[:, 1:-1] = stream[: n * self.body].reshape(n, self.body)
        seqs[:, -1] = self.sep_id
        return {"input_ids": seqs, **documents}

    def _documents(self, lengths: np.ndarray, keys: np.ndarray, n: int) -> dict[str, np.ndarray]:
        """The documents of the `n` rows cut from carry + these documents; keeps the carry's for later."""
        framed = lengths.astype(np.int64) + 1  # each document and its separator
        begins = len(self.carry) + np.cumsum(framed) - framed
        starts = np.concatenate([self.carry_spans[:, 0], begins])
        ends = np.concatenate([self.carry_spans[:, 1], begins + lengths])
        keys = np.concatenate([self.carry_keys, keys])
        has_tokens = ends > starts  # a document's separator alone does not put it in a row
        starts, ends, keys = starts[has_tokens], ends[has_tokens], keys[has_tokens]
        first, last = starts // self.body, (ends - 1) // self.body
        spread = last - first + 1  # rows each document touches; documents come in order, so rows ascend
        rows = np.repeat(first, spread) + np.arange(int(spread.sum())) - np.repeat(np.cumsum(spread) - spread, spread)
        done = rows < n
        cut = n * self.body
        later = ends > cut
        self.carry_keys = keys[later]
        self.carry_spans = np.stack([np.maximum(starts[later] - cut, 0), ends[later] - cut], axis=1)
        return {DOCUMENT_COUNTS: np.bincount(rows[done], minlength=n).astype(np.int32),
                DOCUMENT_KEYS: np.repeat(keys, spread)[done]}

    def _finish(self) -> Sequences:
        self.stats.dropped_tokens += int(np.count_nonzero(self.carry != self.sep_id))
        self.carry = self.carry[:0]
        self.carry_keys, self.carry_spans = self.carry_keys[:0], self.carry_spans[:0]
        return self.empty()

    def state(self):
        scalars, arrays = super().state()
        return scalars, {"carry": self.carry, "carry_keys": self.carry_keys, "carry_spans": self.carry_spans}

    def load_state(self, scalars, arrays):
        super().load_state(scalars, arrays)
        self.carry = arrays["carry"].astype(self.dtype)
        self.carry_keys = arrays["carry_keys"].astype(np.int64)
        self.carry_spans = arrays["carry_spans"].astype(np.int64).reshape(-1, 2)


class DocPacker(Packer):
    """DOC-SENTENCES: sequences never cross a document boundary; short ones are padded (and counted)."""

    mode = "doc"
    fields = ("input_ids", "length")

    def _add(self, ids: np.ndarray, lengths: np.ndarray, keys: np.ndarray) -> Sequences:
        body = self.seq_len - 2
        chunks_per_doc = -(-lengths // body)  # ceil division; empty documents give no sequence
        n = int(chunks_per_doc.sum())
        seqs = np.full((n, self.seq_len), self.pad_id, self.dtype)
        seq_lengths = np.empty(n, np.int32)
        row, start = 0, 0
        for doc_len in lengths.tolist():
            for offset in range(0, doc_len, body):
                take = min(body, doc_len - offset)
                seqs[row, 0] = self.cls_id
                seqs[row, 1: take + 1] = ids[start + offset: start + offset + take]
                seqs[row, take + 1] = self.sep_id
                seq_lengths[row] = take + 2
                row += 1
            start += doc_len
        return {"input_ids": seqs, "length": seq_lengths, DOCUMENT_COUNTS: np.ones(n, np.int32),
                DOCUMENT_KEYS: np.repeat(keys, chunks_per_doc)}


class DocPackedPacker(Packer):
    """Whole documents packed into rows with no padding but at a row's end (MosaicBERT, ModernBERT).

    Each document (or each `seq_len - 2`-token piece of a longer one, as in `doc` mode) is framed
    `<s> … </s>` exactly as it would be alone, so that with attention kept inside documents and
    positions restarting at each (pipeline/models/architectures/packed_attention.py) a packed row computes what
    its documents would compute one by one. Pieces are placed best-fit into a bounded set of open
    rows, in stream order: deterministic, memory-bounded, and far denser than next-fit. A row also
    closes when it holds `max_docs` documents (the width of `doc_starts`).
    """

    mode = "doc-packed"
    fields = ("input_ids", "length", "doc_starts")

    def __init__(self, *args, open_rows: int = 16, max_docs: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.open_rows = open_rows
        self.max_docs = max_docs or max(1, self.seq_len // 8)
        self.rows: list[np.ndarray] = []  # open rows' tokens, each seq_len long (pad-filled)
        self.fills: list[int] = []
        self.starts: list[list[int]] = []
        self.keys: list[list[int]] = []  # each open row's document keys

    def _row_shape(self, name: str) -> tuple[int, ...]:
        return (self.max_docs,) if name == "doc_starts" else super()._row_shape(name)

    def _add(self, ids: np.ndarray, lengths: np.ndarray, keys: np.ndarray) -> Sequences:
        body = self.seq_len - 2
        out: list[tuple[np.ndarray, int, list[int], list[int]]] = []
        start = 0
        for doc_len, key in zip(lengths.tolist(), keys.tolist(), strict=True):
            for offset in range(0, doc_len, body):
                piece = ids[start + offset: start + min(offset + body, doc_len)]
                out += self._place(piece, key)
            start += doc_len
        return self._frame(out)

    def _place(self, piece: np.ndarray, key: int) -> list[tuple[np.ndarray, int, list[int], list[int]]]:
        """Put one framed piece into the tightest open row it fits; return the rows this closed."""
        need = len(piece) + 2
        closed = []
        fits = [i for i, fill in enumerate(self.fills)
                if self.seq_len - fill >= need and len(self.starts[i]) < self.max_docs]
        if fits:
            row = min(fits, key=lambda i: (self.seq_len - self.fills[i], i))
        else:
            if len(self.rows) >= self.open_rows:  # make room: close the fullest open row
                fullest = max(range(len(self.rows)), key=lambda i: (self.fills[i], -i))
                closed.append(self._close(fullest))
            self.rows.append(np.full(self.seq_len, self.pad_id, self.dtype))
            self.fills.append(0)
            self.starts.append([])
            self.keys.append([])
            row = len(self.rows) - 1
        at = self.fills[row]
        tokens = self.rows[row]
        tokens[at] = self.cls_id
        tokens[at + 1: at + 1 + len(piece)] = piece
        tokens[at + 1 + len(piece)] = self.sep_id
        self.starts[row].append(at)
        self.keys[row].append(key)
        self.fills[row] = at + need
        # A row with no room for even an empty framed document (3 tokens) is done.
        if self.seq_len - self.fills[row] < 3 or len(self.starts[row]) == self.max_docs:
            closed.append(self._close(row))
        return closed

    def _close(self, row: int) -> tuple[np.ndarray, int, list[int], list[int]]:
        return self.rows.pop(row), self.fills.pop(row), self.starts.pop(row), self.keys.pop(row)

    def _frame(self, rows: list[tuple[np.ndarray, int, list[int], list[int]]]) -> Sequences:
        if not rows:
            return self.empty()
        starts = np.full((len(rows), self.max_docs), -1, np.int32)
        for i, (_, _, row_starts, _) in enumerate(rows):
            starts[i, : len(row_starts)] = row_starts
        return {"input_ids": np.stack([r[0] for r in rows]), "length": np.array([r[1] for r in rows], np.int32),
                "doc_starts": starts, **_ragged([r[3] for r in rows])}

    def _finish(self) -> Sequences:
        rows = [self._close(0) for _ in range(len(self.rows))]
        return self._frame(rows)

    def state(self):
        scalars, arrays = super().state()
        scalars["fills"] = list(self.fills)
        scalars["starts"] = [list(s) for s in self.starts]
        scalars["keys"] = [list(k) for k in self.keys]
        arrays["rows"] = np.stack(self.rows) if self.rows else np.zeros((0, self.seq_len), self.dtype)
        return scalars, arrays

    def load_state(self, scalars, arrays):
        super().load_state(scalars, arrays)
        self.rows = [row.astype(self.dtype).copy() for row in arrays["rows"]]
        self.fills = list(scalars["fills"])
        self.starts = [list(s) for s in scalars["starts"]]
        self.keys = [list(k) for k in scalars["keys"]]


class PairsPacker(Packer):
    """BERT's segment pairs for next-sentence prediction: `[CLS] A [SEP] B [SEP]`, padded.

    Each document is walked left to right. A takes a random number of tokens from the current
    position; half the time B is the true continuation (label 0), otherwise a span of the same
    budget from another, recent document (label 1), and the walk resumes right after A so no
    text of the current document is wasted (as in BERT's create_pretraining_data.py). Segments
    are cut at token rather than sentence boundaries. "Another document" is drawn from a pool of
    the last `pool_size` documents, which keeps memory bounded and the result deterministic.
    """

    mode = "pairs"
    fields = ("input_ids", "length", "segment_b_start", "nsp_label")

    def __init__(self, *args, seed: int = 0, pool_size: int = 64, **kwargs):
        super().__init__(*args, **kwargs)
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.pool: deque[np.ndarray] = deque(maxlen=pool_size)
        self.pool_keys: deque[int] = deque(maxlen=pool_size)

    def _add(self, ids: np.ndarray, lengths: np.ndarray, keys: np.ndarray) -> Sequences:
        budget = self.seq_len - 3
        rows: list[tuple[np.ndarray, np.ndarray, int]] = []
        row_keys: list[list[int]] = []
        start = 0
        for doc_len, key in zip(lengths.tolist(), keys.tolist(), strict=True):
            doc = ids[start: start + doc_len].astype(self.dtype, copy=False)
            start += doc_len
            pos = 0
            while pos < doc_len:
                chunk = doc[pos: pos + budget]
                if len(chunk) < 2:
                    self.stats.dropped_tokens += len(chunk)
                    break
                a_len = int(self.rng.integers(1, len(chunk)))
                if self.pool and self.rng.random() < 0.5:
                    pick = int(self.rng.integers(len(self.pool)))
                    other = self.pool[pick]
                    b_len = min(budget - a_len, len(other))
                    b_start = int(self.rng.integers(0, len(other) - b_len + 1))
                    rows.append((chunk[:a_len], other[b_start: b_start + b_len], 1))
                    row_keys.append([key, self.pool_keys[pick]])
                    pos += a_len
                else:
                    rows.append((chunk[:a_len], chunk[a_len:], 0))
                    row_keys.append([key])
                    pos += len(chunk)
            if doc_len:
                self.pool.append(doc.copy())
                self.pool_keys.append(key)
        return {**self._frame(rows), **_ragged(row_keys)}

    def _frame(self, rows: list[tuple[np.ndarray, np.ndarray, int]]) -> Sequences:
        n = len(rows)
        seqs = np.full((n, self.seq_len), self.pad_id, self.dtype)
        length = np.empty(n, np.int32)
        b_start = np.empty(n, np.int32)
        label = np.empty(n, np.int8)
        for i, (a, b, is_random) in enumerate(rows):
            la, lb = len(a), len(b)
            seqs[i, 0] = self.cls_id
            seqs[i, 1: 1 + la] = a
            seqs[i, 1 + la] = self.sep_id
            seqs[i, 2 + la: 2 + la + lb] = b
            seqs[i, 2 + la + lb] = self.sep_id
            length[i], b_start[i], label[i] = la + lb + 3, la + 2, is_random
        return {"input_ids": seqs, "length": length, "segment_b_start": b_start, "nsp_label": label}

    def state(self):
        scalars, arrays = super().state()
        scalars["rng"] = self.rng.bit_generator.state
        lengths = np.array([len(d) for d in self.pool], np.int64)
        arrays["pool_ids"] = np.concatenate(list(self.pool)) if self.pool else np.zeros(0, self.dtype)
        arrays["pool_lengths"] = lengths
        arrays["pool_keys"] = np.array(self.pool_keys, np.int64)
        return scalars, arrays

    def load_state(self, scalars, arrays):
        super().load_state(scalars, arrays)
        self.rng.bit_generator.state = scalars["rng"]
        self.pool.clear()
        offsets = np.concatenate([[0], np.cumsum(arrays["pool_lengths"])])
        for a, b in zip(offsets[:-1], offsets[1:], strict=True):
            self.pool.append(arrays["pool_ids"][a:b].astype(self.dtype))
        self.pool_keys.clear()
        self.pool_keys.extend(arrays["pool_keys"].tolist())


PACKERS: dict[str, type[Packer]] = {"full": FullPacker, "doc": DocPacker, "doc-packed": DocPackedPacker,
                                     "pairs": PairsPacker}


def make_packer(mode: PackMode, seq_len: int, cls_id: int, sep_id: int, pad_id: int, dtype, seed: int = 0) -> Packer:
    """Build the packer for `mode`; `seed` only matters for pairs."""
    if mode not in PACKERS:
        raise ValueError(f"unknown packing mode {mode!r}; expected one of {', '.join(PACKERS)}")
    kwargs = {"seed": seed} if mode == "pairs" else {}
    return PACKERS[mode](seq_len, cls_id, sep_id, pad_id, dtype, **kwargs)


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)
