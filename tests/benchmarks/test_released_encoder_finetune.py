"""released_encoder_finetune's command line: a bad task list stops before any model is loaded or trained, and a
part of the benchmark writes its own record instead of replacing the whole one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules, as when run

from released_encoder_finetune import record_name  # noqa: E402


def test_only_the_whole_benchmark_writes_the_main_record():
    assert record_name(["sst2", "rte"], no_parity=False) == "released_encoder_finetune"
    assert record_name(["rte"], no_parity=False) == "released_encoder_finetune.rte"
    assert record_name(["sst2", "rte"], no_parity=True) == "released_encoder_finetune.sst2-rte-extra-rows"


@pytest.mark.parametrize(("args", "message"), [
    (["--tasks", "sst2,mnli"], "--tasks: expected a subset of sst2,rte, got 'sst2,mnli'"),
    (["--tasks", ""], "--tasks: expected a subset of sst2,rte"),
    (["--no-parity", "--no-scratch"], "leaves nothing to run"),
    (["--extra-model", "budget"], "--extra-model: expected NAME=DIR"),
])
def test_a_bad_command_line_is_refused_with_the_flag_named(args, message, tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/released_encoder_finetune.py", *args, "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert not any(tmp_path.iterdir())  # nothing written
