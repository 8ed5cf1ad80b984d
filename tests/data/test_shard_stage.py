"""The shard stage end to end: determinism, restart, refusal, distributed parts, corruption, bad input."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import zstandard
from helpers import PYTHON, ROOT, decode_documents, make_documents, run_script, tiny_pretrain_config, write_jsonl
from transformers import AutoTokenizer

from pipeline.common.errors import PipelineError
from pipeline.data.shards.index import verify_folder
from pipeline.data.shards.options import ShardOptions
from pipeline.data.shards.reader import ShardedDataset
from pipeline.data.shards.stage import run_shard_stage
from pipeline.data.shards.tokenize_worker import val_score


def shard(corpus, tokenizer, out, **overrides) -> dict:
    settings = dict(inputs=(str(corpus),), tokenizer=str(tokenizer), seq_len=32, out=str(out), workers=1,
                    shard_size=50, quiet=True)
    settings.update(overrides)
    return run_shard_stage(ShardOptions(**settings))


def file_digests(folder: Path, suffix: str = ".zst") -> dict[str, str]:
    """sha256 of every shard file (and origins file) outside parts/; `suffix` picks some of them."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*.zst")) if "parts" not in p.parts and p.name.endswith(suffix)}


def test_index_is_complete_and_reader_gives_back_the_sequences(tmp_path, corpus_jsonl, bpe_tokenizer_dir, documents):
    index = shard(corpus_jsonl, bpe_tokenizer_dir, tmp_path / "s", val_fraction=0.1)
    assert index["seq_len"] == 32 and index["dtype"] == "uint16" and index["pack"] == "full"
    assert index["tokenizer"]["vocab_size"] == 400 and index["tokenizer"]["fingerprint"].startswith("sha256:")
    assert index["totals"]["documents"] == len(documents)
    assert index["args"]["inputs"] == [str(corpus_jsonl)]
    for split in ("train", "val"):
        entry = index["splits"][split]
        assert entry["sequences"] == sum(s["sequences"] for s in entry["shards"]) > 0
        assert all(len(s["sha256"]) == 64 and s["sequences"] <= 50 for s in entry["shards"])
    ds = ShardedDataset(tmp_path / "s", "train")
    assert len(ds) == index["splits"]["train"]["sequences"]
    seq = ds[len(ds) - 1]["input_ids"]
    assert seq.shape == (32,) and seq[0] == 0 and seq[-1] == 2
    assert verify_folder(tmp_path / "s") == []


def test_output_is_byte_identical_with_one_and_two_workers(tmp_path, corpus_jsonl, bpe_tokenizer_dir):
    shard(corpus_jsonl, bpe_tokenizer_dir, tmp_path / "w1", workers=1, pack="pairs", val_fraction=0.2)
    shard(corpus_jsonl, bpe_tokenizer_dir, tmp_path / "w2", workers=2, pack="pairs", val_fraction=0.2)
    one, two = file_digests(tmp_path / "w1"), file_digests(tmp_path / "w2")
    assert len(one) > 4 and one == two
    i1, i2 = (json.loads((tmp_path / w / "index.json").read_text()) for w in ("w1", "w2"))
    assert i1["splits"] == i2["splits"] and i1["totals"] == i2["totals"]


def test_validation_split_holds_whole_documents_disjoint_from_training(tmp_path, corpus_jsonl, bpe_tokenizer_dir,
                                                                       documents):
    index = shard(corpus_jsonl, bpe_tokenizer_dir, tmp_path / "s", pack="doc", seq_len=256, val_fraction=0.25)
    train = {t.split()[0] for t in decode_documents(tmp_path / "s", "train", bpe_tokenizer_dir)}
    val = {t.split()[0] for t in decode_documents(tmp_path / "s", "val", bpe_tokenizer_dir)}
    assert train.isdisjoint(val)
    assert train | val == {d.split()[0] for d in documents}
    assert val == {d.split()[0] for d in documents if val_score(d) < 0.25}
    assert index["totals"]["val_documents"] == len(val)


def test_doc_mode_gives_back_every_document_text(tmp_path, corpus_jsonl, bpe_tokenizer_dir, documents):
    shard(corpus_jsonl, bpe_tokenizer_dir, tmp_path / "s", pack="doc", seq_len=256, val_fraction=0.0)
    assert decode_documents(tmp_path / "s", "train", bpe_tokenizer_dir) == documents


def test_all_input_formats_give_the_same_shards(tmp_path, bpe_tokenizer_dir):
    docs = make_documents(60, seed=1)
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_jsonl(inputs / "c.jsonl", docs)
    (inputs / "c.txt").write_text("\n\n".join(docs) + "\n")
    (inputs / "lines.txt").write_text("\n".join(docs) + "\n")
    (inputs / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress((inputs / "c.jsonl").read_bytes()))
    (inputs / "c.txt.gz").write_bytes(gzip.compress((inputs / "c.txt").read_bytes()))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": docs, "n": list(range(60))}), inputs / "c.parquet")
    variants = {
        "jsonl": dict(corpus=inputs / "c.jsonl"),
        "txt": dict(corpus=inputs / "c.txt"),
        "lines": dict(corpus=inputs / "lines.txt", one_doc_per_line=True),
        "zst": dict(corpus=inputs / "c.jsonl.zst"),
        "gz": dict(corpus=inputs / "c.txt.gz"),
        "parquet": dict(corpus=inputs / "c.parquet"),
        "hf": dict(corpus=f"hf:{inputs}", hf_split="train", text_field="text"),
    }
    digests = {}
    for name, kw in variants.items():
        corpus = kw.pop("corpus")
        if name == "hf":  # a datasets folder: only the parquet file, read streaming
            hf_dir = tmp_path / "hf"
            hf_dir.mkdir()
            (hf_dir / "train.parquet").write_bytes((inputs / "c.parquet").read_bytes())
            corpus = f"hf:{hf_dir}"
        index = shard(corpus, bpe_tokenizer_dir, tmp_path / f"out-{name}", **kw)
        assert index["totals"]["documents"] == 60, name
        assert index["origins"]["files"] == [str(corpus)]  # a dataset as hf:NAME
        digests[name] = file_digests(tmp_path / f"out-{name}")
    shards = {name: {k: v for k, v in d.items() if not k.endswith(".origins.zst")} for name, d in digests.items()}
    assert all(d == shards["jsonl"] for d in shards.values()), {k: len(v) for k, v in shards.items()}
    # Document i is line i of the jsonl and one-per-line text, row i of the parquet and record i of the dataset,
    # but line 2i - 1 of the blank-line-separated text.
    assert all(digests[name] == digests["jsonl"] for name in ("lines", "zst", "parquet", "hf"))
    assert digests["txt"] == digests["gz"] != digests["jsonl"]
    # A folder and a glob read every supported file in sorted order.
    index = shard(inputs, bpe_tokenizer_dir, tmp_path / "dir")
    assert index["totals"]["documents"] == 60 * 5 + 1  # lines.txt has no blank line: one document
    index = shard(str(inputs / "c.*"), bpe_tokenizer_dir, tmp_path / "glob")
    assert index["totals"]["documents"] == 60 * 5


def test_rerun_with_same_arguments_is_a_no_op_and_different_arguments_are_refused(tmp_path, corpus_jsonl,
                                                                                   bpe_tokenizer_dir):
    out = tmp_path / "s"
    shard(corpus_jsonl, bpe_tokenizer_dir, out)
    before = file_digests(out)
    shard(corpus_jsonl, bpe_tokenizer_dir, out, workers=2)  # workers do not change the output
    assert file_digests(out) == before
    with pytest.raises(PipelineError, match=r"different arguments \(changed: seq_len\).*--overwrite"):
        shard(corpus_jsonl, bpe_tokenizer_dir, out, seq_len=64)
    assert file_digests(out) == before
    index = shard(corpus_jsonl, bpe_tokenizer_dir, out, seq_len=64, overwrite=True)
    assert index["seq_len"] == 64 and verify_folder(out) == []



def test_the_same_files_named_by_another_path_are_the_same_arguments(tmp_path, corpus_jsonl, bpe_tokenizer_dir,
                                                                      monkeypatch):
    out = tmp_path / "s"
    shard(corpus_jsonl, bpe_tokenizer_dir, out)
    before = file_digests(out)
    monkeypatch.chdir(tmp_path)
    relative = os.path.relpath(bpe_tokenizer_dir, tmp_path)
    shard(os.path.relpath(corpus_jsonl, tmp_path), relative, out)  # a no-op, not "changed: tokenizer"
    assert file_digests(out) == before

def test_a_folder_with_other_files_is_not_written_into(tmp_path, corpus_jsonl, bpe_tokenizer_dir):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(PipelineError, match="not empty and holds no shard index"):
        shard(corpus_jsonl, bpe_tokenizer_dir, out)
    shard(corpus_jsonl, bpe_tokenizer_dir, out, overwrite=True)
    assert (out / "notes.txt").read_text() == "keep me"


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2], ids=["one-process", "rank-0-of-2-reading-a-byte-range"])
def test_restart_after_kill_carries_on_and_gives_identical_bytes(tmp_path, bpe_tokenizer_dir, world_size):
    corpus = write_jsonl(tmp_path / "big.jsonl", make_documents(6000, seed=7))
    common = ["--input", corpus, "--tokenizer", bpe_tokenizer_dir, "--seq-len", "32", "--shard-size", "20",
              "--workers", "1", "--val-fraction", "0.1", "--world-size", world_size, "--rank", "0", "--quiet"]
    for rank in range(1, world_size):  # the other rank, if any, runs undisturbed: its finished part serves both
        run_script("data_prep/shard.py", *common, "--rank", rank, "--out", tmp_path / "whole", check=True)
        shutil.copytree(tmp_path / "whole", tmp_path / "killed")
    run_script("data_prep/shard.py", *common, "--out", tmp_path / "whole", check=True)

    out = tmp_path / "killed"
    proc = subprocess.Popen([PYTHON, str(ROOT / "data_prep/shard.py"), *map(str, common), "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    snapshot = out / "parts" / "part00000.resume.zst"
    deadline = time.monotonic() + 600  # start-up alone can take a minute on busy shared cores
    while not snapshot.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    assert snapshot.exists(), "killed before the first resume snapshot was written"
    assert proc.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (out / "index.json").exists()
    partial = file_digests(out)

    rerun = run_script("data_prep/shard.py", *common[:-1], "--out", out, check=True)
    assert "resuming part00000" in rerun.stderr
    assert file_digests(out) == file_digests(tmp_path / "whole")
    assert file_digests(out, ".origins.zst")  # the documents' origins are resumed too
    assert all(file_digests(out)[name] == digest for name, digest in partial.items())
    whole = json.loads((tmp_path / "whole" / "index.json").read_text())
    resumed = json.loads((out / "index.json").read_text())
    assert resumed["splits"] == whole["splits"] and resumed["totals"] == whole["totals"]


def test_ranks_write_parts_and_the_last_one_combines_the_index(tmp_path, corpus_jsonl, bpe_tokenizer_dir,
                                                                 documents):
    out = tmp_path / "s"
    first = shard(corpus_jsonl, bpe_tokenizer_dir, out, rank=1, world_size=2, val_fraction=0.1)
    assert first["rank"] == 1 and not (out / "index.json").exists()
    assert run_script("data_prep/shard.py", "--combine", "--world-size", "2", "--out", out).returncode == 2
    index = shard(corpus_jsonl, bpe_tokenizer_dir, out, rank=0, world_size=2, val_fraction=0.1)
    assert index["totals"]["documents"] == len(documents)
    assert {p["rank"] for p in index["parts"]} == {0, 1}
    assert all(p["stats"]["documents"] > 0 for p in index["parts"])
    assert verify_folder(out) == []
    combined = run_script("data_prep/shard.py", "--combine", "--world-size", "2", "--out", out, check=True)
    assert f"{len(documents):,}" in combined.stdout


def test_each_rank_reads_only_its_byte_range_and_reruns_are_byte_identical(tmp_path, bpe_tokenizer_dir):
    corpus = write_jsonl(tmp_path / "c.jsonl", make_documents(3000, seed=11))
    whole = shard(corpus, bpe_tokenizer_dir, tmp_path / "one", pack="doc", seq_len=256)
    for run in ("a", "b"):
        for rank in (2, 0, 1):
            index = shard(corpus, bpe_tokenizer_dir, tmp_path / run, rank=rank, world_size=3, pack="doc", seq_len=256)
    assert file_digests(tmp_path / "a") == file_digests(tmp_path / "b")
    assert index["totals"]["documents"] == whole["totals"]["documents"] == 3000
    assert index["totals"]["document_tokens"] == whole["totals"]["document_tokens"]
    size = corpus.stat().st_size
    assert whole["parts"][0]["input_bytes_read"] == size
    for part in index["parts"]:
        assert part["input_bytes_read"] <= size / 3 + 64 * 1024  # its third, and at most a read buffer more
    ranges = sorted((p["start"], p["stop"]) for part in json_parts(tmp_path / "a") for p in part["inputs"])
    assert [r for pair in ranges for r in pair] == [0, *[r[1] for r in ranges[:-1] for _ in (0, 1)], size]
    # Rank-local text, whole documents: decoding every rank's shards gives back every document once.
    texts = sorted(decode_documents(tmp_path / "a", "train", bpe_tokenizer_dir)
                   + decode_documents(tmp_path / "a", "val", bpe_tokenizer_dir))
    assert texts == sorted(make_documents(3000, seed=11))


def json_parts(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((folder / "parts").glob("part*.json"))]


def test_shards_made_with_default_options_are_accepted_by_pretraining(tmp_path, corpus_jsonl, bpe_tokenizer_dir):
    from pipeline.pretrain.preflight import load_pretrain_config

    proc = run_script("data_prep/shard.py", "--input", corpus_jsonl, "--tokenizer", bpe_tokenizer_dir, "--seq-len", 64,
                      "--out", tmp_path / "s", "--workers", 1, check=True)  # no --val-fraction: 5% held out
    assert "warning" not in proc.stdout
    index = json.loads((tmp_path / "s" / "index.json").read_text())
    assert index["args"]["val_fraction"] == 0.05 and index["splits"]["val"]["sequences"] > 0
    config = tmp_path / "pretrain.json"
    config.write_text(json.dumps(tiny_pretrain_config(tmp_path / "s", bpe_tokenizer_dir, tmp_path / "run")))
    load_pretrain_config(config, check_files=True)


def test_a_corpus_too_small_for_a_validation_split_is_warned_about_and_pretraining_names_the_fix(
        tmp_path, bpe_tokenizer_dir):
    from pipeline.common.config.tree import ConfigError
    from pipeline.pretrain.preflight import load_pretrain_config

    corpus = write_jsonl(tmp_path / "small.jsonl", make_documents(12, seed=5))
    proc = run_script("data_prep/shard.py", "--input", corpus, "--tokenizer", bpe_tokenizer_dir, "--seq-len", 16,
                      "--out", tmp_path / "s", "--workers", 1, check=True)
    assert "warning: --val-fraction 0.05 gave no validation sequence" in proc.stdout
    assert "rerun with a larger --val-fraction" in proc.stdout
    config = tmp_path / "pretrain.json"
    config.write_text(json.dumps(tiny_pretrain_config(tmp_path / "s", bpe_tokenizer_dir, tmp_path / "run",
                                                      train={"global_batch_size": 4, "micro_batch_size": 4})))
    with pytest.raises(ConfigError, match=r"no validation sequences .*--val-fraction 0.05\); re-run "
                                          r"data_prep/shard.py with a larger --val-fraction"):
        load_pretrain_config(config, check_files=True)


def test_verify_and_reader_name_a_corrupted_or_truncated_shard(tmp_path, corpus_jsonl, bpe_tokenizer_dir):
    out = tmp_path / "s"
    index = shard(corpus_jsonl, bpe_tokenizer_dir, out)
    assert run_script("data_prep/verify_shards.py", out).returncode == 0
    victim = out / index["splits"]["train"]["shards"][1]["file"]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    proc = run_script("data_prep/verify_shards.py", out)
    assert proc.returncode == 1 and victim.name in proc.stderr and "sha256" in proc.stderr
    with pytest.raises(PipelineError, match=f"{victim.name} is corrupt or truncated"):
        ds = ShardedDataset(out, "train")
        [ds[i] for i in range(len(ds))]
    victim.write_bytes(bytes(data[: len(data) // 3]))
    proc = run_script("data_prep/verify_shards.py", out)
    assert proc.returncode == 1 and victim.name in proc.stderr and "truncated" in proc.stderr
    shard(corpus_jsonl, bpe_tokenizer_dir, out)  # a rerun redoes the damaged part
    assert verify_folder(out) == []


def test_reader_refuses_another_tokenizer_or_sequence_length(tmp_path, corpus_jsonl, bpe_tokenizer_dir):
    shard(corpus_jsonl, bpe_tokenizer_dir, tmp_path / "s")
    with pytest.raises(PipelineError, match="sequence length is 32, the run expects 64"):
        ShardedDataset(tmp_path / "s", seq_len=64)
    with pytest.raises(PipelineError, match="made with another tokenizer"):
        ShardedDataset(tmp_path / "s", tokenizer_fingerprint="sha256:0000")
    with pytest.raises(PipelineError, match="has no index.json"):
        ShardedDataset(tmp_path)


def test_pairs_shards_carry_segments_and_nsp_labels(tmp_path, corpus_jsonl, wordpiece_tokenizer_dir):
    index = shard(corpus_jsonl, wordpiece_tokenizer_dir, tmp_path / "s", pack="pairs", seq_len=64)
    assert index["fields"] == ["input_ids", "length", "segment_b_start", "nsp_label"]
    tok = AutoTokenizer.from_pretrained(wordpiece_tokenizer_dir)
    ds = ShardedDataset(tmp_path / "s")
    item = ds[3]
    ids, b = item["input_ids"], int(item["segment_b_start"])
    assert ids[0] == tok.cls_token_id and ids[b - 1] == tok.sep_token_id
    labels = np.array([ds[i]["nsp_label"] for i in range(len(ds))])
    assert 0.3 < labels.mean() < 0.7


# ----------------------------------------------------------------------------- bad input, through the CLI


def cli(tmp_path, *inputs, tokenizer, extra=()) -> subprocess.CompletedProcess:
    return run_script("data_prep/shard.py", "--input", *inputs, "--tokenizer", tokenizer, "--seq-len", "32",
                      "--out", tmp_path / "out", "--workers", "1", *extra)


def cli_succeeds(tmp_path, *inputs, tokenizer) -> tuple[subprocess.CompletedProcess, dict]:
    proc = cli(tmp_path, *inputs, tokenizer=tokenizer)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads((tmp_path / "out" / "index.json").read_text())


def assert_clean_error(proc, *fragments):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr
    return proc


def test_missing_path_unknown_extension_and_binary_file_are_clear_errors(tmp_path, bpe_tokenizer_dir):
    tok = bpe_tokenizer_dir
    assert_clean_error(cli(tmp_path, tmp_path / "nope.jsonl", tokenizer=tok), "nope.jsonl: no such file")
    (tmp_path / "c.docx").write_text("hello")
    assert_clean_error(cli(tmp_path, tmp_path / "c.docx", tokenizer=tok), "c.docx: unknown extension .docx")
    (tmp_path / "bin.txt").write_bytes(b"text" + bytes(range(256)) * 4)
    assert_clean_error(cli(tmp_path, tmp_path / "bin.txt", tokenizer=tok), "bin.txt: looks like a binary file")
    (tmp_path / "bad.jsonl.zst").write_bytes(b"not zstd at all")
    assert_clean_error(cli(tmp_path, tmp_path / "bad.jsonl.zst", tokenizer=tok), "bad.jsonl.zst: not a valid zst")
    assert not (tmp_path / "out" / "index.json").exists()


def test_empty_corpus_is_an_error_and_writes_no_index(tmp_path, bpe_tokenizer_dir):
    (tmp_path / "empty.txt").write_text("")
    assert_clean_error(cli(tmp_path, tmp_path / "empty.txt", tokenizer=bpe_tokenizer_dir), "the corpus is empty")
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n{"text": "   "}\n')
    assert_clean_error(cli(tmp_path, tmp_path / "blank.jsonl", tokenizer=bpe_tokenizer_dir), "no usable document")
    assert not (tmp_path / "out" / "index.json").exists()


def test_invalid_utf8_is_replaced_and_counted_or_an_error_under_strict(tmp_path, bpe_tokenizer_dir):
    path = tmp_path / "c.txt"
    path.write_bytes(b"good document one\n\nbad \xff\xfe bytes here\n\nanother good one\n")
    proc, index = cli_succeeds(tmp_path, path, tokenizer=bpe_tokenizer_dir)
    assert index["totals"]["skipped"]["invalid_utf8"] == 1 and index["totals"]["documents"] == 3
    assert "c.txt line 3: invalid UTF-8 at byte 4" in proc.stdout
    strict = cli(tmp_path, path, tokenizer=bpe_tokenizer_dir, extra=("--strict", "--overwrite"))
    assert_clean_error(strict, "c.txt line 3: invalid UTF-8 at byte 4", "--strict")
    assert not (tmp_path / "out" / "index.json").exists()


def test_malformed_jsonl_line_is_counted_or_an_error_under_strict(tmp_path, bpe_tokenizer_dir):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "first document"}\n{"text": "broken\n{"text": "third"}\n{"body": "x"}\n')
    proc, index = cli_succeeds(tmp_path, path, tokenizer=bpe_tokenizer_dir)
    assert index["totals"]["skipped"]["bad_record"] == 2 and index["totals"]["documents"] == 2
    assert "c.jsonl line 2: malformed JSON" in proc.stdout and "c.jsonl line 4: no string field 'text'" in proc.stdout
    strict = cli(tmp_path, path, tokenizer=bpe_tokenizer_dir, extra=("--strict", "--overwrite"))
    assert_clean_error(strict, "c.jsonl line 2: malformed JSON")


def test_wrong_text_field_is_caught_before_any_work(tmp_path, bpe_tokenizer_dir):
    path = write_jsonl(tmp_path / "c.jsonl", ["a doc"], field="body")
    assert_clean_error(cli(tmp_path, path, tokenizer=bpe_tokenizer_dir),
                       "c.jsonl line 1: the record has no field 'text' (fields: body, id); pass --text-field")


@pytest.mark.slow
def test_a_single_50_mb_line_is_skipped_and_counted_without_loading_it(tmp_path, bpe_tokenizer_dir):
    path = tmp_path / "huge.txt"
    with open(path, "wb") as fh:
        fh.write(b"a normal first document\n\n")
        fh.write(b"word " * 10_000_000 + b"\n\n")  # 50 MB on one line
        fh.write(b"a normal last document\n")
    proc, index = cli_succeeds(tmp_path, path, tokenizer=bpe_tokenizer_dir)
    assert index["totals"]["skipped"]["oversized"] == 1 and index["totals"]["documents"] == 2
    assert "huge.txt line 3: document over --max-doc-bytes" in proc.stdout


def test_tokenizer_without_special_tokens_and_unwritable_output_are_clear_errors(tmp_path, corpus_jsonl,
                                                                                 bpe_tokenizer_dir):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    bare = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(bpe_tokenizer_dir / "tokenizer.json")))
    bare.save_pretrained(tmp_path / "bare")
    assert_clean_error(cli(tmp_path, corpus_jsonl, tokenizer=tmp_path / "bare"),
                       "lacks the special tokens cls/bos, sep/eos, pad, mask")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_script("data_prep/shard.py", "--input", corpus_jsonl, "--tokenizer", bpe_tokenizer_dir,
                      "--seq-len", "32", "--out", blocker / "sub")
    assert_clean_error(proc, f"output folder {blocker / 'sub'} cannot be written")


def test_invalid_arguments_are_reported_together(tmp_path, corpus_jsonl, bpe_tokenizer_dir):
    proc = cli(tmp_path, corpus_jsonl, tokenizer=bpe_tokenizer_dir,
               extra=("--val-fraction", "1.5", "--shard-size", "0", "--rank", "3", "--world-size", "2"))
    assert_clean_error(proc, "--val-fraction 1.5", "--shard-size 0", "--rank 3 --world-size 2")
