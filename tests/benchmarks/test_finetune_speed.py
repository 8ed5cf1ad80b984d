"""finetune_speed rehearsed: both sides run whole on a tiny model, a tiny SST-2 folder and a few topic articles, and
the record (kept out of benchmarks/results) holds the time row, where the pipeline's time went, the accuracy row, the
headlines and the machine; a bad --model is refused before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import WORDS
from model_folders import save_export

ROOT = Path(__file__).resolve().parents[2]


def tiny_sst2(root: Path, train: int, dev: int) -> Path:
    """A GLUE folder whose SST-2 has `train` and `dev` sentences: the label is whether the first word is `the`."""
    (root / "SST-2").mkdir(parents=True)
    for split, n in (("train", train), ("dev", dev)):
        rows = [f"{WORDS[i % 2]} {WORDS[(i * 7) % len(WORDS)]} {WORDS[(i * 3) % len(WORDS)]}\t{(i + 1) % 2}"
                for i in range(n)]
        (root / "SST-2" / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return root


def tiny_topics(path: Path, articles: int) -> Path:
    """Articles in BBC News's form (category, text: headline, blank line, paragraphs) of two topics."""
    rows = [{"category": ("tech", "sport")[i % 2], "id": str(i),
             "text": f"{WORDS[i % 2]} {WORDS[(i * 5) % len(WORDS)]}\n\n{WORDS[(i * 3) % len(WORDS)]} words.\n\nMore."}
            for i in range(articles)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_small_run_times_both_sides_and_records_them(tmp_path, bpe_tokenizer_dir):
    model = save_export(bpe_tokenizer_dir, tmp_path / "tiny")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "benchmarks/finetune_speed.py", "--model", f"tiny={model}",
         "--glue", str(tiny_sst2(tmp_path / "glue", 24, 8)), "--train", "24", "--dev", "8", "--epochs", "1",
         "--seeds", "1", "--max-seq-len", "16", "--tracking", "on", "--repeats", "1", "--out", str(out),
         "--topics", str(tiny_topics(tmp_path / "topics.jsonl", 40)), "--topic-train", "24", "--topic-dev", "8",
         "--topic-seeds", "1", "--weight-decays", "0.1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "BENCHMARK_RESULTS_DIR": str(out)})
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "finetune_speed.json").read_text())
    times, phases, accuracy = record["results"]["tables"]
    (row,) = times["rows"]
    assert row["model"] == "tiny" and row["MLflow"] == "on on both sides (a new MLflow store each)"
    assert float(row["pipeline wall s"]) > 0 and float(row["HF wall s"]) > 0
    assert float(row["pipeline CPU s"]) > 0 and float(row["HF CPU s"]) > 0
    assert 0 <= float(row["pipeline dev accuracy"]) <= 1 and 0 <= float(row["HF dev accuracy (best epoch)"]) <= 1
    (spent,) = phases["rows"]  # the run's own clock: its phases add up to its total, within the process's CPU time
    shares = [float(v) for k, v in spent.items() if k not in ("model", "MLflow", "total")]
    assert float(spent["training steps"]) > 0 and float(spent["tracking"]) > 0
    assert abs(sum(shares) - float(spent["total"])) < 0.05 and float(spent["total"]) <= float(row["pipeline CPU s"])
    (topics,) = accuracy["rows"]
    assert topics["weight decay"] == "0.1" and len(topics["pipeline seeds"].split()) == 1
    assert abs(float(topics["pipeline − HF"]) - (float(topics["pipeline dev accuracy"])
                                                 - float(topics["HF dev accuracy"]))) < 0.0015
    assert set(record["results"]["headline"]) == {
        "tiny, tracking on on both sides (a new MLflow store each): HF ÷ pipeline, whole run (CPU time)",
        "tiny: dev accuracy, pipeline − HF at the same settings (medians)"}
    assert record["machine"]["cpu_model"] and record["load_start"] and record["load_end"]
    # Both sides trained the seed in full: the pipeline kept its best epoch's model, HF saved its own.
    runs = out / "runs" / "tiny" / "tracking-on"
    assert (runs / "pipeline" / "seed_1" / "model" / "config.json").exists()
    assert (runs / "hf" / "seed_1" / "config.json").exists()
    for side in ("pipeline", "hf"):  # each side tracked into a store of its own
        assert (runs / side / "mlflow.db").stat().st_size > 0


def test_a_model_without_a_name_is_refused_before_anything_runs(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/finetune_speed.py", "--model", str(tmp_path),
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--model: expected NAME=DIR" in done.stderr
    assert not (tmp_path / "out").exists()
