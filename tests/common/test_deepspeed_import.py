"""A pretraining process imports DeepSpeed without mlflow (its autotuner's import, ~2 s), and mlflow still
imports afterwards for a run with tracking on; its CPU process group starts without DeepSpeed's shared-memory comm
op, which training never calls (its JIT build took 40-70 s on a new environment's first pretraining)."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import ROOT

PROBE = """
import os, sys
import torch
from pipeline.common.processes.topology import init_process_group, prepare_environment
topology = prepare_environment()
assert "deepspeed" in sys.modules, "prepare_environment imports deepspeed"
assert "mlflow" not in sys.modules, "deepspeed brought mlflow in"
init_process_group(topology, timeout_s=60)
import deepspeed.comm.comm as ds_comm
assert ds_comm.cdb.shm_comm_op is None, "DeepSpeed loaded its shared-memory comm op"
assert not os.listdir(os.environ["TORCH_EXTENSIONS_DIR"]), os.listdir(os.environ["TORCH_EXTENSIONS_DIR"])
total = torch.ones(3)
ds_comm.all_reduce(total)  # the engine's all-reduce: torch.distributed's, gloo
assert total.tolist() == [1.0, 1.0, 1.0]
import mlflow
print("mlflow", mlflow.__version__)
"""


def test_a_pretraining_process_starts_without_mlflow_or_the_shared_memory_comm_op(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    extensions = tmp_path / "torch_extensions"  # empty: a new environment's folder, where a build would land
    extensions.mkdir()
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, timeout=300, capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(ROOT), "TORCH_EXTENSIONS_DIR": str(extensions),
                               "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("mlflow ")
