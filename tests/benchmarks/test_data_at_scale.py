"""data_at_scale: synthetic folders that verify, the extrapolation, and a small end-to-end run writing its record."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import data_at_scale as bench  # noqa: E402

from pipeline.data.shards.index import verify_folder  # noqa: E402
from pipeline.data.shards.reader import ShardedDataset  # noqa: E402


def test_a_synthetic_folder_is_committed_and_verifies_like_one_shard_py_made(tmp_path, bpe_tokenizer_dir):
    made = bench.write_synthetic(tmp_path / "s", 20_000, bpe_tokenizer_dir)
    assert made["tokens"] == 20_000 // bench.SEQ_LEN * bench.SEQ_LEN
    assert verify_folder(tmp_path / "s") == []
    ids = ShardedDataset(tmp_path / "s", "train", seq_len=bench.SEQ_LEN)[7]["input_ids"]
    assert ids.dtype == np.uint16 and ids.min() >= 5 and len(set(ids.tolist())) > 50  # ordinary ids, random


def test_the_extrapolation_follows_the_two_largest_sizes_and_never_slopes_down():
    rows = [{"tokens": 1e7, "x": 10.0}, {"tokens": 1e8, "x": 50.0}, {"tokens": 1e9, "x": 50.0}]
    assert bench.extrapolate(rows, "x") == 50.0  # flat from 100M on: the small size's slope is not carried
    rows[2]["x"] = 140.0  # +90 per 900M tokens
    assert bench.extrapolate(rows, "x") == pytest.approx(140.0 + 0.1e-6 * 99e9)
    rows[2]["x"] = 45.0
    assert bench.extrapolate(rows, "x") == 45.0


@pytest.mark.slow
def test_a_small_run_measures_each_size_and_records_measured_and_extrapolated_rows(tmp_path, bpe_tokenizer_dir,
                                                                                    corpus_jsonl):
    work = tmp_path / "work"
    shutil.copytree(bpe_tokenizer_dir, work / "tokenizer")
    env = {**os.environ, "BENCHMARK_RESULTS_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "benchmarks/data_at_scale.py", "--work", str(work), "--corpus",
                           str(corpus_jsonl), "--synthetic-tokens", "2e4", "2e5", "--imdb-copies", "--real-copies",
                           "0", "--files", "0", "--index-tokens", "2e9"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    tables = json.loads((tmp_path / "data_at_scale.json").read_text())["results"]["tables"]
    index, made, runs = tables
    assert [r["shards"] for r in index["rows"]] == [f"{2_000_000_000 // (8192 * bench.SEQ_LEN):,}"]
    assert [r["case"] for r in made["rows"]] == ["synthetic-0.02M", "synthetic-0.2M"]
    assert [r["figures"] for r in runs["rows"]][:2] == ["measured", "measured"]
    assert runs["rows"][2]["case"] == "100B tokens" and runs["rows"][2]["figures"].startswith("extrapolated")
    assert all(float(r["first step (s)"].replace(",", "")) > 0 for r in runs["rows"])
    assert not (work / "synthetic-0.02M").exists()  # deleted once measured
