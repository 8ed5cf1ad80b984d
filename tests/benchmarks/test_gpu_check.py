"""benchmarks/gpu_check.py: one record of every step, each failure recorded and the check going on.

The CPU run is the GPU check's own code at toy size. Asked for CUDA on a machine without it, every
step fails for real: the record must hold each failure and the check must still finish.
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


def test_past_its_budget_a_step_is_skipped_as_out_of_time_without_running():
    steps = gpu_check.Steps(budget_s=3600)
    assert steps.attempt("early", lambda: {"x": 1}) == {"x": 1}
    steps.budget_s = 0
    ran = []
    assert steps.attempt("late", lambda: ran.append(1)) is None
    assert ran == [] and steps.outcomes[-1]["status"] == "skipped"
    assert steps.outcomes[-1]["reason"].startswith("out of time") and steps.seconds_left() < 0
    assert gpu_check.Steps().seconds_left() is None  # no budget: never out of time


def test_the_nominal_peak_is_the_data_sheets_dense_figure_by_gpu_name():
    assert gpu_check.nominal_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu_check.nominal_tflops("NVIDIA H100 PCIe") == 756.0
    assert gpu_check.nominal_tflops("NVIDIA H200") == 989.0
    assert gpu_check.nominal_tflops("Some Future GPU") is None and gpu_check.nominal_tflops(None) is None


def run_check(tmp_path, *args: str) -> tuple[dict, subprocess.CompletedProcess]:
    env = {**os.environ, "BENCHMARK_RESULTS_DIR": str(tmp_path), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    done = subprocess.run([PYTHON, "benchmarks/gpu_check.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(next(tmp_path.glob("gpu_check*.json")).read_text())
    return record, done


def cpu_compiler() -> bool:
    from torch._inductor import exc
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        return False
    return True


@pytest.mark.slow
def test_asked_for_cuda_where_there_is_none_every_step_fails_into_the_record_and_the_check_ends(tmp_path):
    record, done = run_check(tmp_path, "--device", "cuda", "--skip", "throughput")
    results = record["results"]
    outcome = {o["step"]: o for o in results["steps"]}
    assert outcome["environment"]["status"] == "failed" and results["environment"] == {}
    for arch in gpu_check.ARCHITECTURES:
        reference = outcome[f"correctness/{arch}/fp32"]
        assert reference["status"] == "failed" and "CUDA" in reference["error"]
        for cell in (f"correctness/{arch}/{p}/zero{z}" for p in ("bf16", "fp16") for z in (0, 2)):
            assert outcome[cell] == {"step": cell, "status": "skipped", "reason": "the fp32 reference failed"}
    packed = [o for name, o in outcome.items() if name.startswith("packed/")]
    assert len(packed) == 4 * 3 and all(o["status"] == "failed" for o in packed)
    assert results["summary"]["failed"] == 1 + 4 + 12 and "FAILED" in done.stdout
    assert [len(t["rows"]) for t in results["tables"]] == [16, 12]


@pytest.mark.slow
def test_the_cpu_tiny_check_writes_one_record_of_every_step(tmp_path):
    """`--device cpu --tiny`: each cell ok, fp16 skipped with DeepSpeed's reason; without a C++ compiler the
    inductor cells (FlexAttention, train.compile) are recorded as failed and the rest still runs."""
    record, done = run_check(tmp_path, "--device", "cpu", "--tiny")
    assert record["benchmark"] == "gpu_check.cpu-tiny" and record["provenance"] == "measured"
    results = record["results"]
    assert results["environment"]["torch"] and set(results["environment"]["peak_tflops"]) == {"bf16", "fp32"}
    outcome = {o["step"]: o for o in results["steps"]}
    needs_compiler = [*(f"packed/{arch}/flex_attention" for arch in gpu_check.ARCHITECTURES),
                      *(f"throughput/{model}/compile" for model in gpu_check.SHAPES)]
    failed = sorted(o["step"] for o in results["steps"] if o["status"] == "failed")
    assert failed == ([] if cpu_compiler() else sorted(needs_compiler)), failed

    for arch in gpu_check.ARCHITECTURES:
        assert outcome[f"correctness/{arch}/fp32"]["status"] == "ok"
        for stage in (0, 2):
            bf16 = outcome[f"correctness/{arch}/bf16/zero{stage}"]
            assert bf16["status"] == "ok" and bf16["relative_difference"] <= gpu_check.TOLERANCE["bf16"]
            fp16 = outcome[f"correctness/{arch}/fp16/zero{stage}"]
            assert fp16["status"] == "skipped" and "not supported" in fp16["reason"]
        for attention in ("sdpa", "eager"):
            packed = outcome[f"packed/{arch}/{attention}"]
            assert packed["status"] == "ok" and packed["max_abs_difference"] <= 1e-4
    for model in gpu_check.SHAPES:
        eager = outcome[f"throughput/{model}/eager"]
        assert eager["status"] == "ok" and eager["tokens_per_s"] > 0 and 0 < eager["mfu_measured_peak"]
        assert eager["mfu_nominal_peak"] is None  # no data-sheet peak for a CPU
    assert outcome["throughput/ModernBERT-base/eager"]["attention"] == "sdpa"  # no FlexAttention backward on CPU

    titles = [t["title"] for t in results["tables"]]
    assert [t.split(":")[0] for t in titles] == ["correctness", "packed documents", "throughput"]
    assert [len(t["rows"]) for t in results["tables"]] == [16, 12, 6]
    summary = results["summary"]
    assert summary["ok"] + summary["failed"] + summary["skipped"] == len(results["steps"])
    assert summary["skipped"] == 8 and "| architecture | precision | zero |" in done.stdout
