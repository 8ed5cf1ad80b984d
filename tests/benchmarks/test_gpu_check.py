"""benchmarks/gpu_check.py: one record of every step, each failure recorded and the check going on.

The CPU run is the GPU check's own code at toy size. It runs here without a C++ compiler (CXX points
nowhere), so FlexAttention and `train.compile`, which inductor compiles, fail for real: the record must
name those failures while every other step still runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import PYTHON, ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules, as when run

import gpu_check  # noqa: E402


def test_a_step_that_raises_is_recorded_as_failed_and_the_next_one_runs():
    steps = gpu_check.Steps()
    assert steps.attempt("boom", lambda: 1 / 0) is None

    def cannot():
        raise gpu_check.Skipped("fp16: not on CPU")

    assert steps.attempt("fp16", cannot) is None
    assert steps.attempt("fine", lambda: {"loss": 1.5}) == {"loss": 1.5}
    boom, fp16, fine = steps.outcomes
    assert boom["status"] == "failed" and boom["error"] == "ZeroDivisionError: division by zero"
    assert "1 / 0" in boom["traceback"]
    assert fp16 == {"step": "fp16", "status": "skipped", "reason": "fp16: not on CPU"}
    assert fine["status"] == "ok" and fine["loss"] == 1.5


def test_the_nominal_peak_is_the_data_sheets_dense_figure_by_gpu_name():
    assert gpu_check.nominal_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu_check.nominal_tflops("NVIDIA H100 PCIe") == 756.0
    assert gpu_check.nominal_tflops("NVIDIA H200") == 989.0
    assert gpu_check.nominal_tflops("Some Future GPU") is None and gpu_check.nominal_tflops(None) is None


@pytest.mark.slow
def test_the_cpu_tiny_check_writes_one_record_and_records_its_failures(tmp_path):
    env = {**os.environ, "BENCHMARK_RESULTS_DIR": str(tmp_path), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
           "CXX": str(tmp_path / "no-compiler")}
    done = subprocess.run([PYTHON, "benchmarks/gpu_check.py", "--device", "cpu", "--tiny"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "gpu_check.cpu-tiny.json").read_text())
    assert record["benchmark"] == "gpu_check.cpu-tiny" and record["provenance"] == "measured"
    results = record["results"]
    assert results["environment"]["torch"] and set(results["environment"]["peak_tflops"]) == {"bf16", "fp32"}
    outcome = {o["step"]: o for o in results["steps"]}

    for arch in gpu_check.ARCHITECTURES:
        assert outcome[f"correctness/{arch}/fp32"]["status"] == "ok"
        for stage in (0, 2):
            bf16 = outcome[f"correctness/{arch}/bf16/zero{stage}"]
            assert bf16["status"] == "ok" and bf16["relative_difference"] <= gpu_check.TOLERANCE["bf16"]
            fp16 = outcome[f"correctness/{arch}/fp16/zero{stage}"]
            assert fp16["status"] == "skipped" and "not supported" in fp16["reason"]
        for attention in ("sdpa", "eager"):
            assert outcome[f"packed/{arch}/{attention}"]["status"] == "ok"
        flex = outcome[f"packed/{arch}/flex_attention"]  # inductor found no compiler: recorded, not raised
        assert flex["status"] == "failed" and flex["error"]

    for model in ("RoBERTa-base", "RoBERTa-large"):
        eager = outcome[f"throughput/{model}/eager"]
        assert eager["status"] == "ok" and eager["tokens_per_s"] > 0 and 0 < eager["mfu_measured_peak"]
        assert eager["mfu_nominal_peak"] is None  # no data-sheet peak for a CPU
        compiled = outcome[f"throughput/{model}/compile"]
        assert compiled["status"] == "failed" and "C++ compiler" in compiled["error"]
    packed = outcome["throughput/ModernBERT-base/eager"]  # doc-packed rows, SDPA's dense mask on CPU
    assert packed["status"] == "ok" and packed["attention"] == "sdpa" and packed["tokens_per_s"] > 0
    assert outcome["throughput/ModernBERT-base/compile"]["status"] == "failed"

    titles = [t["title"] for t in results["tables"]]
    assert [t.split(":")[0] for t in titles] == ["correctness", "packed documents", "throughput"]
    assert len(results["tables"][0]["rows"]) == 16 and len(results["tables"][2]["rows"]) == 6
    summary = results["summary"]
    assert summary["ok"] + summary["failed"] + summary["skipped"] == len(results["steps"])
    failed = sorted(o["step"] for o in results["steps"] if o["status"] == "failed")
    assert failed == sorted([*(f"packed/{arch}/flex_attention" for arch in gpu_check.ARCHITECTURES),
                             *(f"throughput/{model}/compile" for model in gpu_check.SHAPES)]), failed
    assert summary["failed"] == len(failed)
    assert "| correctness" not in done.stdout and "| architecture | precision | zero |" in done.stdout
