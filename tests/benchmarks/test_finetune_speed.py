"""finetune_speed rehearsed: both sides run whole on a tiny model and a tiny SST-2 folder, and the record (kept out
of benchmarks/results) holds the row, the headline and the machine; a bad --model is refused before anything runs."""

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


def test_a_small_run_times_both_sides_and_records_them(tmp_path, bpe_tokenizer_dir):
    model = save_export(bpe_tokenizer_dir, tmp_path / "tiny")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "benchmarks/finetune_speed.py", "--model", f"tiny={model}",
         "--glue", str(tiny_sst2(tmp_path / "glue", 24, 8)), "--train", "24", "--dev", "8", "--epochs", "1",
         "--seeds", "1", "--max-seq-len", "16", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "BENCHMARK_RESULTS_DIR": str(out)})
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "finetune_speed.json").read_text())
    (table,) = record["results"]["tables"]
    (row,) = table["rows"]
    assert row["model"] == "tiny"
    assert float(row["pipeline wall s"]) > 0 and float(row["HF wall s"]) > 0
    assert float(row["pipeline CPU s"]) > 0 and float(row["HF CPU s"]) > 0
    assert 0 <= float(row["pipeline dev accuracy"]) <= 1 and 0 <= float(row["HF dev accuracy (best epoch)"]) <= 1
    assert "tiny: HF ÷ pipeline, whole run (CPU time)" in record["results"]["headline"]
    assert record["machine"]["cpu_model"] and record["load_start"] and record["load_end"]
    # Both sides trained the seed in full: the pipeline kept its best epoch's model, HF saved its own.
    assert (out / "runs" / "tiny" / "pipeline" / "seed_1" / "model" / "config.json").exists()
    assert (out / "runs" / "tiny" / "hf" / "seed_1" / "config.json").exists()


def test_a_model_without_a_name_is_refused_before_anything_runs(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/finetune_speed.py", "--model", str(tmp_path),
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--model: expected NAME=DIR" in done.stderr
    assert not (tmp_path / "out").exists()
