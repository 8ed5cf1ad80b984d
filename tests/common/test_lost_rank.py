"""A rank that loses the others: torch's errors told apart, the message, and the watchdog's bounded exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from helpers import ROOT

from pipeline.common.processes.lost_rank import LOST_RANK_EXIT_CODE, is_lost_peer, lost_rank_error

GLOO_RESET = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[127.0.0.1]:23742: Connection reset by peer. This is typically caused by a remote worker hanging or "
              "bugs in the application. Check the logs of the remote worker before reporting an error. GLHF!")


def test_a_peer_gone_or_silent_is_told_apart_from_other_errors():
    assert is_lost_peer(RuntimeError(GLOO_RESET))
    assert is_lost_peer(RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms for "
                                     "recv operation to complete"))
    assert not is_lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x64 and 32x64)"))
    assert not is_lost_peer(ValueError("Connection reset by peer"))  # not raised by a collective


def test_the_message_names_the_rank_the_step_the_timeout_and_the_resume_point():
    err = lost_rank_error(RuntimeError(GLOO_RESET), 0, 2, "after step 15", 300.0,
                          "Rerun the same command to resume from the last complete checkpoint, ck/step_10 (step 10).")
    text = str(err)
    assert text.startswith("rank 0 of 2 lost contact with the other ranks after step 15: RuntimeError: Read error "
                           "[127.0.0.1]:23742: Connection reset by peer. Another rank died")
    assert "GLHF" not in text and "pair.cc" not in text
    assert "at most 300 s (train.collective_timeout_s)" in text and text.endswith("(step 10).")


def test_the_watchdog_ends_a_rank_blocked_past_its_timeout():
    script = textwrap.dedent("""
        import time
        from pipeline.common.processes.lost_rank import RankWatchdog
        dog = RankWatchdog(0.5, lambda where: f"blocked {where}", poll_s=0.05)
        with dog.guard("at step 1"):
            pass  # a step in time
        with dog.guard("at step 2"):
            time.sleep(30)  # a collective that never returns
    """)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=20,
                          env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == LOST_RANK_EXIT_CODE
    assert proc.stderr.strip() == "error: blocked at step 2"
    assert time.monotonic() - started < 10
