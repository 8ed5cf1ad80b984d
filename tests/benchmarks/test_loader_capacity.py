"""loader_capacity: the GPU demand it compares against, and a small end-to-end run writing its record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import loader_capacity as bench  # noqa: E402


def test_an_h100_at_45_percent_mfu_consumes_about_430_roberta_large_sequences_of_512_per_second():
    demand = bench.gpu_demand(512)
    # 24 × (4·1024² + 2·1024·4096) + 2·1024·24·512 + 0.15 × (1024² + 1024·50265), ×6 ≈ 2.0 GFLOP a token.
    assert demand["RoBERTa-large, 45% MFU"] == pytest.approx(0.45 * 989e12 / 2.011e9 / 512, rel=0.01)
    assert demand["ModernBERT-base, 300k tokens/s"] == pytest.approx(300_000 / 512)
    assert bench.gpu_demand(1024)["ModernBERT-base, 300k tokens/s"] == pytest.approx(300_000 / 1024)


@pytest.mark.slow
def test_a_small_run_measures_every_masking_unit_and_records_the_verdict(tmp_path):
    env = {**os.environ, "BENCHMARK_RESULTS_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "benchmarks/loader_capacity.py", "--seq-lens", "64", "--micro-batch", "4",
                           "--batches", "3"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "loader_capacity.json").read_text())
    (table,) = record["results"]["tables"]
    assert [(r["masking"], r["GPU target"]) for r in table["rows"]] == [
        (unit, target) for unit in ("token", "word", "span") for target in bench.gpu_demand(64)]
    assert all(float(r["one worker (seq/s)"].replace(",", "")) > 0 for r in table["rows"])
    (headline,) = record["results"]["headline"].values()
    assert headline["target"] == "≥ 2×" and isinstance(headline["met"], bool)
