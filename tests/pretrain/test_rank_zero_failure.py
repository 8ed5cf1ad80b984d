"""One failure, every rank: an error on rank 0 while it plans for every rank (the start's checkpoints, a rollback's
target, the rollback's plan, a saved checkpoint's record) reaches the other ranks at once, named. Before, they waited
for a plan that never came until rank 0's process ended, or for the collective timeout while it lived on (as in the
script, which goes on to its next case), and then named a lost rank."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers import PYTHON, ROOT

from pipeline.common.processes.topology import free_port

pytestmark = pytest.mark.slow  # one torchrun launch of 2 ranks

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
NAMED_WITHIN_S = 5.0
"""Far below the script's collective timeout (60 s), which is what a rank that was not told would wait."""


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    out = tmp_path_factory.mktemp("rank-zero-failure")
    command = [str(Path(PYTHON).parent / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port()),
               "tests/dist/rank_zero_failure.py", str(out)]
    proc = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    ended = time.time()
    ranks = [json.loads((out / f"rank{r}.json").read_text()) if (out / f"rank{r}.json").exists() else None
             for r in range(2)]
    replan_started = [float(p.read_text()) for p in out.glob("rank*.replan")]
    return {"proc": proc, "ranks": ranks, "replan_seconds": ended - min(replan_started, default=ended),
            "output": proc.stdout + proc.stderr}


@pytest.mark.parametrize(("case", "error"), [
    ("checkpoint", "OSError: [Errno 28] No space left on device"),
    ("rollback", "OSError: [Errno 5] Input/output error"),
    ("save", "OSError: [Errno 28] No space left on device"),
])
def test_a_failure_on_rank_0_while_planning_reaches_every_rank_at_once_named(launch, case, error):
    zero, one = launch["ranks"]
    assert zero is not None and one is not None, launch["output"][-3000:]
    print(f"{case}: rank 0 raised after {zero[case]['seconds']:.2f} s, rank 1 after {one[case]['seconds']:.2f} s")
    assert zero[case]["raised"] == "OSError"
    assert one[case]["raised"] == "PipelineError", one[case]
    assert one[case]["message"].startswith("rank 1 of 2 stops: rank 0 failed while ")
    assert error in one[case]["message"]
    assert one[case]["seconds"] < NAMED_WITHIN_S


def test_a_failure_on_rank_0_while_replanning_a_rollback_ends_every_rank_named(launch):
    proc, output = launch["proc"], launch["output"]
    print(f"replan: the launch ended {launch['replan_seconds']:.1f} s after the ranks started it")
    assert proc.returncode != 0
    assert "carried out a rollback rank 0 could not plan" not in output
    assert ("error: rank 1 of 2 stops: rank 0 failed while planning a rollback (the run from its checkpoint): spike "
            "guard: the rollback cannot start (checkpoint step_00000040: complete.json is damaged)") in output
    assert launch["replan_seconds"] < 30
