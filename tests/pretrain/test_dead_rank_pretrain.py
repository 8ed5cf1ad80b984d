"""A dead rank does not hang pretraining: the survivor names the fault, the launcher fails, a rerun resumes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from helpers import PYTHON, ROOT, tiny_pretrain_config

from pipeline.common.processes.topology import free_port
from pipeline.common.run_layout import PretrainLayout

pytestmark = pytest.mark.slow  # two torchrun launches of 2 ranks

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1"}
TIMEOUT_S = 20  # train.collective_timeout_s for this run; the default is 300


def torchrun(config: Path) -> list[str]:
    return [str(Path(PYTHON).parent / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port()),
            "launchers/pretrain.py", "--config", str(config)]


def logged_steps(output_dir: Path) -> list[int]:
    metrics = PretrainLayout(output_dir).metrics
    if not metrics.exists():
        return []
    return [r["step"] for r in map(json.loads, metrics.read_text().splitlines()) if "train/loss" in r]


def rank_process(launcher: subprocess.Popen, rank: int) -> psutil.Process:
    for child in psutil.Process(launcher.pid).children(recursive=True):
        if child.environ().get("RANK") == str(rank) and "launchers/pretrain.py" in " ".join(child.cmdline()):
            return child
    raise AssertionError(f"no rank {rank} under the launcher")


def test_a_rank_killed_mid_step_ends_the_job_with_a_message_and_a_rerun_resumes(tmp_path, roberta_shards,
                                                                                bpe_tokenizer_dir):
    out = tmp_path / "run"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tiny_pretrain_config(
        roberta_shards, bpe_tokenizer_dir, out, train={"max_steps": 400, "collective_timeout_s": TIMEOUT_S,
                                                       "export": False},
        checkpoint={"every": 5, "keep_last": 2}, data={"cache_dir": str(tmp_path / "cache")})))
    launcher = subprocess.Popen(torchrun(config), cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while len(logged_steps(out)) < 12:  # two checkpoints written, the run well into its steps
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stdout.read()[-3000:]
            time.sleep(0.05)
        rank_process(launcher, 1).send_signal(signal.SIGKILL)  # mid-step: a step takes ~0.1 s
        killed_at = time.monotonic()
        log, _ = launcher.communicate(timeout=TIMEOUT_S + 60)
        ended_after = time.monotonic() - killed_at
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode != 0
    assert ended_after < TIMEOUT_S + 30, f"the job took {ended_after:.0f} s to end after the kill"
    message = re.search(r"error: rank 0 of 2 lost contact with the other ranks after step (\d+): (.*)", log)
    assert message, log[-3000:]
    assert (f"gives up after at most {TIMEOUT_S} s (train.collective_timeout_s)" in message.group(2)
            and "Rerun the same command to resume from the last complete checkpoint" in message.group(2))
    newest = re.search(r"checkpoint, (\S+) \(step (\d+)\)", message.group(2))
    assert newest and int(newest.group(2)) >= 10 and int(newest.group(2)) % 5 == 0
    assert int(message.group(1)) >= int(newest.group(2))
    assert Path(newest.group(1)).parent == PretrainLayout(out).checkpoints
    print(f"\nrank 1 killed after step {message.group(1)}; the launcher exited {launcher.returncode} "
          f"{ended_after:.1f} s later; newest checkpoint step {newest.group(2)}")

    resumed_step = int(newest.group(2))
    rerun = subprocess.run([*torchrun(config), "--set", f"train.max_steps={resumed_step + 3}"], cwd=ROOT, env=ENV,
                           capture_output=True, text=True, timeout=240)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    assert f"resumed from {newest.group(1)} (step {resumed_step})" in rerun.stdout + rerun.stderr
    # Each step once in metrics.jsonl: the steps after the checkpoint were dropped and redone.
    assert logged_steps(out) == list(range(1, resumed_step + 4))
