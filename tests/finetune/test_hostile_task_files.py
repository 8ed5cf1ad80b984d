"""Hostile or broken task files and tokenizer folders, generated (hypothesis, several hundred seeded cases each).

Every reader of a task file (CSV, TSV, JSONL, CoNLL, CoNLL-U, tagged JSONL, SQuAD JSON, QA JSONL,
also gzip/zstd-compressed) is fed random bytes, valid files with invalid UTF-8 spliced in, and
valid files with a 10 MB line. Outcome: a `PipelineError` naming the file (and line), never another
exception; invalid UTF-8 and over-long lines always fail; a sample is traced with tracemalloc to
show a 10 MB line is never read whole (bound: `MAX_LINE_BYTES` per line).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import zstandard
from generated_cases import GENERATED, count, peak_allocation, write_counts
from hypothesis import given
from hypothesis import strategies as st

from pipeline.common.config.size_limits import MAX_LINE_BYTES
from pipeline.common.errors import PipelineError
from pipeline.data.tasks.qa_files import read_qa
from pipeline.data.tasks.splits import read_split
from pipeline.data.tasks.token_files import read_tagged


@pytest.fixture(scope="module", autouse=True)
def report_counts(tmp_path_factory):
    yield
    write_counts(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("task-files")


@pytest.fixture(scope="module")
def memory_folder(tmp_path_factory):
    """A folder in /dev/shm where there is one: writing 300 files of 10 MB to a busy disk is the slow part."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="hostile-task-files-", dir=shm))
        yield path
        shutil.rmtree(path, ignore_errors=True)
    else:
        yield tmp_path_factory.mktemp("long-lines")


@functools.cache
def long_line(fill: bytes) -> bytes:
    return (fill * (10_000_000 // len(fill) + 1))[:10_000_000]


SQUAD = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
    {"context": "The cat sat on the mat.", "qas": [
        {"id": "q1", "question": "Where did the cat sit?", "answers": [{"text": "on the mat", "answer_start": 12}]},
        {"id": "q2", "question": "Why?", "answers": [], "is_impossible": True}]}]}]}

VALID = {  # file name → a valid file's bytes
    "train.csv": b"sentence,label\nthe film is good,1\n\"bad, very bad\",0\nfine,1\n",
    "train.tsv": b"sentence\tlabel\nthe film is good\t1\nbad\t0\nfine\t1\n",
    "train.jsonl": b'{"sentence": "good", "label": "1"}\n{"sentence": "bad", "label": "0"}\n',
    "ner.conll": b"-DOCSTART- -X- O O\n\nEU B-ORG\nrejects O\nGerman B-MISC\n\nPeter B-PER\nBlackburn I-PER\n",
    "pos.conllu": b"# text = a b\n1\ta\ta\tDET\t_\t_\t0\troot\t_\t_\n2\tb\tb\tNOUN\t_\t_\t1\tnmod\t_\t_\n\n",
    "tags.jsonl": b'{"tokens": ["EU", "rejects"], "tags": ["B-ORG", "O"]}\n{"tokens": ["a"], "tags": ["O"]}\n',
    "squad.json": json.dumps(SQUAD).encode(),
    "qa.jsonl": b'{"id": "1", "context": "The cat sat.", "question": "Who sat?", '
                b'"answers": {"text": ["The cat"], "answer_start": [0]}}\n',
}
FORMATS = sorted(VALID)


def read(path: Path):
    """The pipeline's reader for a file of this kind, read to the end."""
    name = path.name.removesuffix(".gz").removesuffix(".zst")
    if name.startswith("train."):
        return read_split(path, ("sentence",), "label", ("0", "1"))
    if name.startswith(("ner.", "pos.", "tags.")):
        return read_tagged(path)
    return read_qa(path)


def write(folder: Path, name: str, data: bytes, compression: str) -> Path:
    path = folder / (name + {"none": "", "gz": ".gz", "zst": ".zst"}[compression])
    if compression == "gz":
        data = gzip.compress(data, mtime=0)
    elif compression == "zst":
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def outcome(path: Path, *, must_fail: bool, trace: bool = False, bound: int = 0) -> str | None:
    """Read `path`: a PipelineError naming it (returned), or success (None) where `must_fail` is False."""
    with (peak_allocation() if trace else contextlib.nullcontext({"peak": 0})) as memory:
        try:
            read(path)
        except PipelineError as err:
            message = str(err)
            assert str(path) in message or path.name in message, message
            return message
        finally:
            path.unlink()
    assert not trace or memory["peak"] <= bound, f"allocated {memory['peak']:,}, bound {bound:,}"
    assert not must_fail, f"{path.name}: read without an error"
    return None


COMPRESSION = st.sampled_from(["none", "none", "none", "gz", "zst"])


@GENERATED
@given(fmt=st.sampled_from(FORMATS), compression=COMPRESSION,
       payload=st.one_of(st.binary(max_size=3000),
                         st.builds(lambda b, cut: b[:cut], st.sampled_from(list(VALID.values())), st.integers(0, 400)),
                         st.text(max_size=300).map(str.encode)))
def test_random_bytes_as_a_task_file_are_named(folder, fmt, compression, payload):
    count("random bytes as a task file (CSV/TSV/JSONL/CoNLL/CoNLL-U/SQuAD/QA JSONL)")
    outcome(write(folder, fmt, payload, compression), must_fail=False)


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """A valid file with a few bytes deleted, replaced or inserted (what a bad copy or editor leaves)."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(0, len(out) - 1)))
        action = draw(st.sampled_from(["delete", "replace", "insert"]))
        chunk = draw(st.binary(min_size=1, max_size=4))
        if action == "delete":
            del out[at: at + len(chunk)]
        elif action == "replace":
            out[at: at + len(chunk)] = chunk
        else:
            out[at:at] = chunk
    return bytes(out)


@GENERATED
@given(fmt=st.sampled_from(FORMATS), compression=COMPRESSION, data=st.data())
def test_damaged_task_files_are_named(folder, fmt, compression, data):
    count("random bytes as a task file (CSV/TSV/JSONL/CoNLL/CoNLL-U/SQuAD/QA JSONL)")
    outcome(write(folder, fmt, data.draw(mutated(VALID[fmt])), compression), must_fail=False)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)


def json_paths(value, prefix=()):
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        yield from json_paths(inner, (*prefix, key))


def replaced(value, path, new):
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new
    return copy


@GENERATED
@given(fmt=st.sampled_from([f for f in FORMATS if f.endswith(("json", "jsonl"))]), data=st.data())
def test_json_task_files_with_values_of_the_wrong_type_are_named(folder, fmt, data):
    count("random bytes as a task file (CSV/TSV/JSONL/CoNLL/CoNLL-U/SQuAD/QA JSONL)")
    records = [json.loads(line) for line in VALID[fmt].decode().splitlines()] if fmt.endswith("l") else \
        [json.loads(VALID[fmt])]
    i = data.draw(st.integers(0, len(records) - 1), label="record")
    path = data.draw(st.sampled_from(sorted(json_paths(records[i]), key=str)), label="at")
    records[i] = replaced(records[i], path, data.draw(JSON_VALUES, label="value"))
    text = "\n".join(json.dumps(r) for r in records)
    outcome(write(folder, fmt, text.encode(), "none"), must_fail=False)


INVALID_UTF8 = st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xa0\xa1", b"\xe2\x28\xa1", b"\xe2\x82\x28",
                                b"\xf0\x28\x8c\xbc", b"\xf8\xa1\xa1\xa1\xa1", b"\xed\xa0\x80", b"\xc0\xaf", b"\x80",
                                b"\xf4\x90\x80\x80", b"\xe0\x80\xaf"])


@GENERATED
@given(fmt=st.sampled_from(FORMATS), compression=COMPRESSION, bad=INVALID_UTF8, where=st.floats(0, 1))
def test_invalid_utf8_is_named_with_its_line(folder, fmt, compression, bad, where):
    count("invalid UTF-8 in a task file")
    data = VALID[fmt]
    at = int(where * len(data))
    message = outcome(write(folder, fmt, data[:at] + bad + data[at:], compression), must_fail=True)
    # Where a reader stops earlier (a CSV header cut in two, say), that problem is the one named.
    assert "UTF-8" in message or "invalid JSON" in message or ":" in message


@GENERATED
@given(fmt=st.sampled_from(FORMATS), where=st.floats(0, 1), fill=st.sampled_from([b"x", b"a b ", b"\t", b",", b"\"",
                                                                                    b"{", b"\xc3\xa9", b" "]),
       trace=st.integers(0, 3))
def test_lines_of_10_mb_are_refused_without_reading_them_whole(memory_folder, fmt, where, fill, trace):
    count("lines of 10 MB in a task file")
    data = VALID[fmt]
    newline = data.find(b"\n", int(where * len(data)))
    at = len(data) if newline < 0 else newline
    content = data[:at] + long_line(fill) + data[at:]
    path = write(memory_folder, fmt, content, "none")  # (compressed files are read through the same bounded readline)
    # SQuAD JSON is one line by design: it is read whole (bounded by MAX_JSON_FILE_BYTES per file, about 4×
    # the file in memory), so a 10 MB line there is refused only when it breaks the JSON. Every other
    # format reads at most MAX_LINE_BYTES of a line.
    bound = 4 * len(content) if fmt == "squad.json" else 3 * MAX_LINE_BYTES
    message = outcome(path, must_fail=fmt != "squad.json", trace=trace == 0, bound=bound + (1 << 20))
    if message and fmt != "squad.json":
        assert "longer than" in message or ":1:" in message or ":2:" in message  # an earlier line may fail first


@pytest.fixture(scope="module")
def tokenizer_copy(tmp_path_factory, bpe_tokenizer_dir) -> Path:
    folder = tmp_path_factory.mktemp("tok") / "bpe"
    shutil.copytree(bpe_tokenizer_dir, folder)
    return folder


@GENERATED
@given(data=st.data())
def test_random_bytes_as_tokenizer_json_are_named(tokenizer_copy, bpe_tokenizer_dir, data):
    from pipeline.data.tokenizer import load_tokenizer

    count("random bytes as tokenizer.json")
    real = (bpe_tokenizer_dir / "tokenizer.json").read_bytes()
    payload = data.draw(st.one_of(
        st.binary(max_size=4000),
        st.builds(lambda cut: real[:cut], st.integers(0, len(real) - 1)),  # a truncated copy
        st.sampled_from([b"", b"{}", b"[]", b"null", b"1e999999", b"[" * 100_000, b'{"model": null}',
                         b'{"version": "1.0", "model": {"type": "BPE", "vocab": 7}}'])), label="tokenizer.json")
    (tokenizer_copy / "tokenizer.json").write_bytes(payload)
    with pytest.raises(PipelineError) as err:
        load_tokenizer(tokenizer_copy)
    assert str(tokenizer_copy) in str(err.value)
    (tokenizer_copy / "tokenizer.json").write_bytes(real)
