"""benchmarks/step_overhead.py: both arms measured the same way, per precision, and the profile's counting itself."""

from __future__ import annotations

import json
import sys

from helpers import ROOT, make_documents

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules, as when run

import plain_loop  # noqa: E402
import step_overhead  # noqa: E402


def test_the_profile_counts_every_operator_and_each_read_of_a_value_once_by_its_range():
    import torch
    from torch.profiler import record_function

    x = torch.arange(6.0)

    def step() -> None:
        x.sum().item()  # item → _local_scalar_dense: one read
        with record_function("Optimizer.step#Toy.step"):
            bool(x.max() > 0)  # is_nonzero → item → _local_scalar_dense: one read
        x[x > 2].add_(1)  # a boolean index → nonzero: one read

    prof = plain_loop.profiler("cpu")
    prof.start()
    for _ in range(2):
        step()
    prof.stop()
    found = plain_loop.summary(prof, 2, "cpu")
    assert found["device_reads_per_step"] == 3
    assert found["device_reads_by_range"] == {"(outside any range)": 2, "Optimizer.step#Toy.step": 1}
    assert found["operator_calls_per_step"] >= 8 and found["syncs_per_step"] == 0


def test_a_short_run_measures_both_arms_and_records_the_targets(tmp_path, monkeypatch):
    import zstandard

    corpus = tmp_path / "data" / "corpus" / "imdb-reviews.jsonl.zst"
    corpus.parent.mkdir(parents=True)
    lines = "".join(json.dumps({"text": t}) + "\n" for t in make_documents(300, seed=1, min_words=20, max_words=150))
    corpus.write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    monkeypatch.setenv("BENCHMARK_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("BENCHMARK_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setattr(sys, "argv", ["benchmarks/step_overhead.py", "--steps", "4", "--repeats", "1",
                                      "--precisions", "fp32", "--data", str(tmp_path / "data")])
    step_overhead.main()
    results = json.loads((tmp_path / "results" / "step_overhead.json").read_text())["results"]
    rows = results["tables"][0]["rows"]
    assert [r["step"] for r in rows] == list(step_overhead.ARMS)
    assert all(r["parameter tensors"] == 394 for r in rows)  # RoBERTa-large's
    assert list(results["headline"]) == ["fp32: operator calls per step, ours ÷ plain",
                                         "fp32: device reads per step, ours", "fp32: step time, ours ÷ plain"]
    assert all("target" in h and h["value"] for h in results["headline"].values())
