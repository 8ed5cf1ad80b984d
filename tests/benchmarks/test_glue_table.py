"""glue_table's command line, sample and table: a bad command stops before anything is written, the training
sample spans the whole of an ordered file, an --out made with other settings is refused by name, and the table
shows every finished cell and marks the rest as not run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules, as when run

from glue_table import TASKS, claim_out, table_rows  # noqa: E402
from harness import glue_sample  # noqa: E402


@pytest.mark.parametrize(("args", "message"), [
    (["--tasks", "sst2,mnli"], "--tasks: expected a subset of cola,sst2,mrpc,stsb,rte, got 'sst2,mnli'"),
    (["--arms", "export,bert"], "--arms: expected a subset of export,scratch,minilm"),
    (["--arms", ""], "--arms: expected a subset"),
])
def test_a_bad_command_line_is_refused_with_the_flag_named(args, message, tmp_path):
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text("{}")
    done = subprocess.run([sys.executable, "benchmarks/glue_table.py", "--export", str(tmp_path / "export"), *args,
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_export_without_a_config_is_refused_before_anything_is_written(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/glue_table.py", "--export", str(tmp_path / "missing"),
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--export" in done.stderr and "no config.json" in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_out_folder_made_with_other_settings_is_refused_naming_them(tmp_path):
    settings = {"train_examples": 2000, "epochs": 3, "seeds": "1,2,3", "export_fingerprint": "abc"}
    claim_out(tmp_path, settings)
    claim_out(tmp_path, dict(settings))  # the same settings: accepted, nothing rewritten
    with pytest.raises(SystemExit, match="epochs 3 there, 5 now"):
        claim_out(tmp_path, {**settings, "epochs": 5})
    assert json.loads((tmp_path / "settings.json").read_text()) == settings


def finished_cell(out: Path, name: str, metric: str, values: list[float], lr: str) -> None:
    folder = out / name
    folder.mkdir(parents=True)
    median = sorted(values)[len(values) // 2]
    (folder / "metrics.json").write_text(json.dumps({
        metric: median, f"{metric}_mean": sum(values) / len(values), f"{metric}_std": 0.01,
        "seeds": list(range(1, len(values) + 1)), "chosen_setting": {"train.learning_rate": lr},
        "per_seed": [{metric: v, "seed": i + 1} for i, v in enumerate(values)]}))


def test_the_table_shows_each_finished_cell_with_its_spread_and_marks_the_rest_not_run(tmp_path):
    finished_cell(tmp_path, "cola-export", "matthews_correlation", [0.10, 0.14, 0.12], "1e-3")
    finished_cell(tmp_path, "cola-minilm", "matthews_correlation", [0.30, 0.35, 0.33], "3e-5")
    (tmp_path / "cola-token-counts.json").write_text(json.dumps({"matthews_correlation": 0.05, "accuracy": 0.69}))
    rows = {row["task"]: row for row in table_rows(tmp_path)}
    assert list(rows) == ["cola", "sst2", "mrpc", "stsb", "rte"]
    cola = rows["cola"]
    assert cola["metric"] == "matthews_correlation"
    assert cola["token counts"] == "0.050"  # the baseline in the arms' metric, not its accuracy
    assert cola["export"] == "0.120 [0.100–0.140]"
    assert cola["MiniLM-L6 (released)"] == "0.330 [0.300–0.350]"
    assert cola["from scratch"] == "not run"
    assert cola["chosen LR (export / scratch / MiniLM)"] == "1e-3 / — / 3e-5"
    assert rows["rte"]["export"] == "not run" and rows["rte"]["token counts"] == "—"


def test_the_training_sample_is_spread_over_an_ordered_file_and_dev_is_untouched(tmp_path):
    from pipeline.data.tasks.catalog import GLUE_FOLDERS, task_spec

    glue = tmp_path / "glue"
    for task in TASKS:
        folder = glue / GLUE_FOLDERS[task]
        folder.mkdir(parents=True)
        header = [] if task_spec(task).headerless_columns else ["header\n"]
        # ordered, as GLUE's files are: one genre, then another
        rows = [f"{'first' if i < 50 else 'second'}-genre row {i}\n" for i in range(100)]
        (folder / "train.tsv").write_text("".join(header + rows))
        (folder / "dev.tsv").write_text("".join(header + ["dev row\n"]))
    sampled = glue_sample(glue, tmp_path / "out", dict.fromkeys(TASKS, 10), spread=True)
    for task in TASKS:
        lines = (sampled / GLUE_FOLDERS[task] / "train.tsv").read_text().splitlines()
        header = [] if task_spec(task).headerless_columns else ["header"]
        assert lines == header + [f"{'first' if i < 50 else 'second'}-genre row {i}" for i in range(0, 100, 10)]
        dev = GLUE_FOLDERS[task] + "/dev.tsv"
        assert (sampled / dev).read_text() == (glue / dev).read_text()
    assert (glue / "CoLA" / "train.tsv").read_text().count("\n") == 100  # the source is not touched
