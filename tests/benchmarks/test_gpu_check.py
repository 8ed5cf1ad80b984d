"""benchmarks/gpu_check.py: one record of every step, each failure recorded and the check going on.

The CPU run is the GPU check's own code at toy size. Asked for CUDA on a machine without it, every
step fails for real: the record must hold each failure and the check must still finish.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import PYTHON, ROOT, make_documents

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules, as when run

import gpu_check  # noqa: E402
import gpu_runs  # noqa: E402


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


def test_a_check_that_fails_after_measuring_keeps_its_figures_in_the_record():
    steps = gpu_check.Steps()

    def too_far_apart():
        raise gpu_runs.CheckFailed("resumed losses differ", {"steps_done": 1600, "pretrain_seconds": 250.0})

    steps.attempt("e2e", too_far_apart)
    failed = steps.outcomes[-1]
    assert failed["status"] == "failed" and failed["error"] == "CheckFailed: resumed losses differ"
    assert failed["steps_done"] == 1600 and failed["pretrain_seconds"] == 250.0


def test_past_its_budget_a_step_is_skipped_as_out_of_time_without_running():
    steps = gpu_check.Steps(budget_s=3600)
    assert steps.attempt("early", lambda: {"x": 1}) == {"x": 1}
    steps.budget_s = 0
    ran = []
    assert steps.attempt("late", lambda: ran.append(1)) is None
    assert ran == [] and steps.outcomes[-1]["status"] == "skipped"
    assert steps.outcomes[-1]["reason"].startswith("out of time") and steps.seconds_left() < 0
    assert gpu_check.Steps().seconds_left() is None  # no budget: never out of time


def test_a_part_past_its_cap_skips_its_steps_and_the_next_part_starts_afresh():
    steps = gpu_check.Steps(budget_s=3600, started=time.perf_counter() - 60)  # the lease began a minute ago
    assert 3539 < steps.seconds_left() <= 3540
    with steps.part(30):
        assert 29 < steps.seconds_left() <= 30  # the nearer end
        steps.part_ends -= 30
        assert steps.attempt("late", lambda: {"x": 1}) is None
    assert steps.outcomes[-1]["reason"] == "out of time: the part's cap of 30 s was spent"
    with steps.part(None):
        assert steps.attempt("next", lambda: {"x": 1}) == {"x": 1}
    steps.budget_s = 0
    with steps.part(30):
        assert steps.attempt("spent", lambda: {"x": 1}) is None
    assert steps.outcomes[-1]["reason"] == "out of time: the check's budget of 0 min was spent"


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


def data_folder(root: Path) -> Path:
    """A folder laid out as /work/shared/data, with made-up text: reviews and SST-2-like labelled sentences."""
    import zstandard

    reviews = make_documents(300, seed=1, min_words=20, max_words=150)
    corpus = root / "corpus" / "imdb-reviews.jsonl.zst"
    corpus.parent.mkdir(parents=True)
    lines = "".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(reviews))
    corpus.write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    sst2 = root / "glue" / "SST-2"
    sst2.mkdir(parents=True)
    for name, rows, seed in (("train.tsv", 96, 2), ("dev.tsv", 32, 3)):
        texts = make_documents(rows, seed=seed, max_words=12)
        sst2.joinpath(name).write_text("sentence\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(texts)))
    return root


def cpu_compiler() -> bool:
    from torch._inductor import exc
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        return False
    return True


def test_the_data_folder_is_given_or_found_in_the_checkout_or_beside_it(tmp_path, monkeypatch):
    assert gpu_runs.find_data(str(tmp_path)) == tmp_path.resolve()
    monkeypatch.setattr(gpu_runs, "ROOT", tmp_path / "checkout")
    assert gpu_runs.find_data(None) is None
    beside = data_folder(tmp_path / "shared" / "data")
    assert gpu_runs.find_data(None) == beside
    inside = data_folder(tmp_path / "checkout" / "shared" / "data")  # how the device tool carries shared/
    assert gpu_runs.find_data(None) == inside


def test_a_rerun_in_the_same_work_folder_reuses_the_data_made_from_the_same_input(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(gpu_runs, "make_data", lambda folder, scale, data: made.append(data) or {"tokenizer": "t"})
    cpu = gpu_runs.Scale("cpu", tiny=True)
    first = gpu_runs.prepared_data(tmp_path, cpu, tmp_path / "data")
    again = gpu_runs.prepared_data(tmp_path, cpu, tmp_path / "data")
    assert len(made) == 1 and again == {**first, "reused": True}
    gpu_runs.prepared_data(tmp_path, cpu, None)  # other input: made again
    gpu_runs.prepared_data(tmp_path, gpu_runs.Scale("cuda", tiny=False), None)  # other sizes: made again
    assert made == [tmp_path / "data", None, None]


def test_a_run_still_going_at_its_cap_is_stopped_by_sigterm_and_one_that_ends_is_waited_for(tmp_path):
    """The run to the end's pretraining past its cap: SIGTERM, which the pretrain command answers by checkpointing
    and exiting 0 (as this stand-in does), and the export's arm then fine-tunes that checkpoint."""
    stand_in = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
                "print('ready', flush=True)\ntime.sleep(60)\n")
    slow = gpu_runs.launch([PYTHON, "-c", stand_in], tmp_path / "slow", dict(os.environ))
    deadline = time.monotonic() + 60
    while "ready" not in (tmp_path / "slow.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)  # its handler is installed
    assert gpu_runs.wait_or_stop(slow, tmp_path / "slow", 0.5) is False and slow.returncode == 0
    quick = gpu_runs.launch([PYTHON, "-c", "pass"], tmp_path / "quick", dict(os.environ))
    assert gpu_runs.wait_or_stop(quick, tmp_path / "quick", 60) is True
    failing = gpu_runs.launch([PYTHON, "-c", "raise SystemExit('no checkpoint')"], tmp_path / "failing",
                              dict(os.environ))
    with pytest.raises(RuntimeError, match="failing exited 1: no checkpoint"):
        gpu_runs.wait_or_stop(failing, tmp_path / "failing", 60)


def test_the_reference_past_its_last_step_is_left_to_exit_not_sent_sigterm(tmp_path):
    """A reference that trained to its end before being stopped: past its training SIGTERM has no handler and would
    kill its exit (-15), so it is waited for; its losses are all logged."""
    run_dir = tmp_path / "reference"
    run_dir.mkdir()
    stand_in = (f"import json, time\nwith open({str(run_dir / 'metrics.jsonl')!r}, 'a') as f:\n"
                "    for step in (1, 2, 3):\n        f.write(json.dumps({'step': step, 'train/loss': 1.0}) + '\\n')\n"
                "time.sleep(1)  # the export and the exit, with no SIGTERM handler\n")
    ending = gpu_runs.launch([PYTHON, "-c", stand_in], run_dir, dict(os.environ))
    assert gpu_runs.signal_after(ending, run_dir, 2, 60, signal.SIGTERM, last_step=3) == 3
    assert ending.returncode == 0


def test_a_version_other_than_the_pinned_one_fails_the_versions_step(monkeypatch):
    pins = gpu_check.pinned_versions()
    assert set(pins) == {"transformers", "tokenizers"}
    assert gpu_check.versions() == {n: {"installed": v, "pinned": v} for n, v in pins.items()}  # as installed here
    monkeypatch.setattr(gpu_check, "installed_version", lambda name: "5.17.0" if name == "transformers" else pins[name])
    with pytest.raises(AssertionError, match=r"transformers 5.17.0 \(pinned 5.24"):
        gpu_check.versions()


@pytest.mark.slow
def test_asked_for_cuda_where_there_is_none_every_step_fails_into_the_record_and_the_check_ends(tmp_path):
    record, done = run_check(tmp_path, "--device", "cuda", "--skip", "targets,e2e,eager,others")
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
def test_the_cpu_rehearsal_runs_every_part_of_the_gpu_check(tmp_path):
    """`--device cpu --tiny`: the GPU check's own code at toy size, every part but the compiled ones. Each eager
    throughput row (loader on, with a worker that must stop at exit, and off, profiled; the plain loop, profiled)
    trains and is measured; the run to the end is
    killed with SIGKILL mid-run, resumes with the same losses as the uninterrupted run (stopped by SIGTERM, which
    checkpoints) and exports; SST-2 is fine-tuned from the export and from scratch, each arm's rate chosen on the
    held-out slice of train, beside the token-count baseline."""
    data = data_folder(tmp_path / "data")
    out = tmp_path / "record"
    out.mkdir()
    # Skipped: `targets` and `others` are the `eager` part's own functions and commands with train.compile set, so
    # here they would only add inductor compiling ModernBERT (a quarter of this test on an AMD EPYC with inductor's
    # cache warm, more when cold). train.compile itself is run end to end (trains, matches the plain run, saves,
    # resumes, exports) by tests/pretrain/test_step_speed.py, and the check on a GPU runs every part.
    record, done = run_check(out, "--device", "cpu", "--tiny", "--data", str(data), "--models", "ModernBERT-base",
                             "--skip", "targets,others")
    assert record["benchmark"] == "gpu_check.cpu-tiny" and record["provenance"] == "measured"
    results = record["results"]
    assert results["environment"]["torch"] and set(results["environment"]["peak_tflops"]) == {"bf16", "fp32"}
    assert results["versions"]["transformers"]["installed"] == results["versions"]["transformers"]["pinned"]
    assert results["data"] == str(data)
    outcome = {o["step"]: o for o in results["steps"]}
    needs_compiler = [f"packed/{arch}/flex_attention" for arch in gpu_check.ARCHITECTURES]
    failed = sorted(o["step"] for o in results["steps"] if o["status"] == "failed")
    assert failed == ([] if cpu_compiler() else sorted(needs_compiler)), [outcome[f] for f in failed]

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
    tables = {t["title"].split(":")[0]: t["rows"] for t in results["tables"]}
    assert list(tables) == ["the run to the end", "transfer", "correctness", "throughput, eager, the targets' models",
                            "packed documents"]  # in order of value; no other model was asked for

    assert not [step for step in outcome if "/compile/" in step]  # skipped as asked
    for arm, batches in (("ours", "loader"), ("ours", "in-memory"), ("plain", "in-memory")):
        row = outcome[f"throughput/ModernBERT-base/{arm}/eager/{batches}"]
        assert row["tokens_per_s"] > 0 and row["mfu_measured_peak"] > 0 and row["mfu_nominal_peak"] is None
        assert row["seq_len"] == 64 and row["micro_batch"] == 4
        # loader off, the steps after the measured ones are profiled: no device reads, its top operators named
        profile = row["profile"]
        assert (profile is None) == (batches == "loader")
        if profile:
            assert profile["steps"] == 3 and profile["syncs_per_step"] == 0 and profile["top"][0]["ms_per_step"] > 0
    ours = outcome["throughput/ModernBERT-base/ours/eager/loader"]
    assert ours["attention"] == "sdpa" and ours["loader_workers"] == 1  # no FlexAttention backward on CPU
    e2e = outcome["e2e/pretrain-kill-resume-export"]
    assert e2e["status"] == "ok" and e2e["identical_losses"] and e2e["max_abs_loss_difference"] == 0.0
    assert e2e["resumed_at_step"] < e2e["killed_at_step"] < e2e["steps"] == e2e["steps_done"]  # killed mid-run
    assert e2e["compared_steps"] > e2e["killed_at_step"] and e2e["completed"] and e2e["export"] == "the run's own"
    # the steps between the checkpoint and the kill were run twice, from the same saved state: the same losses
    assert e2e["redone_steps"] >= e2e["killed_at_step"] - e2e["resumed_at_step"] > 0
    assert e2e["max_abs_redone_loss_difference"] == 0.0
    transfer = outcome["e2e/transfer-sst2"]
    assert transfer["status"] == "ok" and transfer["metric"] == "accuracy"
    for arm in ("pretrained", "scratch"):  # each arm chose its own rate on the held-out slice of train
        assert 0 <= transfer[arm]["median"] <= 1 and 0 <= transfer[arm]["selection_score"] <= 1
        assert transfer[arm]["chosen"]["train.learning_rate"] in gpu_runs.SST2_SWEEP.split("=")[1].split(",")
    assert transfer["difference"] == transfer["pretrained"]["median"] - transfer["scratch"]["median"]
    assert 0 <= transfer["token_baseline"] <= 1
    assert tables["transfer"][0]["difference"].endswith(" points")
    summary = results["summary"]
    assert summary["ok"] + summary["failed"] + summary["skipped"] == len(results["steps"])
    assert "| run | step | compiled | batches | status |" in done.stdout
