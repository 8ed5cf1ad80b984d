"""DeepSpeed's JIT-built ops live in the environment's own folder, so no other environment makes them rebuild."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
from helpers import ROOT

from pipeline.common.processes import topology


@pytest.fixture
def in_venv(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    return tmp_path / "venv"


def test_a_virtual_environment_gets_its_own_extensions_folder(in_venv):
    topology.use_environment_extensions_dir()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(in_venv / "torch_extensions")


def test_the_users_extensions_folder_is_kept(in_venv, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    topology.use_environment_extensions_dir()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "mine")


def test_outside_a_virtual_environment_torch_keeps_its_default(monkeypatch):
    monkeypatch.setattr(sys, "base_prefix", sys.prefix)
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    topology.use_environment_extensions_dir()
    assert "TORCH_EXTENSIONS_DIR" not in os.environ


def test_prepare_environment_sets_it_before_deepspeed_is_imported(in_venv, monkeypatch):
    """`deepspeed launchers/pretrain.py` typed by hand goes through prepare_environment, not setup_env.sh."""
    # prepare_environment invents RANK, MASTER_PORT, … for a plain `python` run: give it a copy of the
    # environment, or they leak into every later test's subprocesses (which would all share one port).
    monkeypatch.setattr(os, "environ", dict(os.environ))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "DS_ACCELERATOR"):
        os.environ.pop(name, None)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # leaves torch's thread count alone
    topology.prepare_environment()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(in_venv / "torch_extensions")


def _source_setup_env(venv, extra_env: dict[str, str]) -> str:
    """Source launchers/setup_env.sh against an environment it sees as installed; return its TORCH_EXTENSIONS_DIR."""
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    stamp = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    (venv / ".roberta-pipeline-installed").write_text(stamp + "\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"} | {"VENV": str(venv), **extra_env}
    proc = subprocess.run(["bash", "-c", 'source launchers/setup_env.sh && echo "$TORCH_EXTENSIONS_DIR"'],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert "installing" not in proc.stdout  # the stamp matched: nothing was installed
    return proc.stdout.strip().splitlines()[-1]


def test_setup_env_exports_the_same_folder_for_the_launchers_and_the_tests(tmp_path):
    assert _source_setup_env(tmp_path / "venv", {}) == str(tmp_path / "venv" / "torch_extensions")


def test_setup_env_keeps_the_users_folder(tmp_path):
    assert _source_setup_env(tmp_path / "venv", {"TORCH_EXTENSIONS_DIR": "/opt/ext"}) == "/opt/ext"
