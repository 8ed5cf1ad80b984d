"""A pretraining process imports DeepSpeed without mlflow (its autotuner's import, ~2 s), and mlflow still
imports afterwards for a run with tracking on."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import ROOT

PROBE = """
import sys
from pipeline.common.topology import prepare_environment
prepare_environment()
assert "deepspeed" in sys.modules, "prepare_environment imports deepspeed"
assert "mlflow" not in sys.modules, "deepspeed brought mlflow in"
import mlflow
print("mlflow", mlflow.__version__)
"""


def test_prepare_environment_imports_deepspeed_but_not_mlflow_which_still_imports_later():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("mlflow ")
