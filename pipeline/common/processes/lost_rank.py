"""A dead or stuck rank ends the job in bounded time, with a message that says what to do.

Two things keep a surviving rank from waiting on a dead one for torch's 30 minutes:

- every collective has a timeout (`collective_timeout`): the process group is created with the
  config's `collective_timeout_s`, and gloo and NCCL both give up on an operation after it;
- a `RankWatchdog` thread ends the process if one guarded section (an optimizer step, with its
  gradient all-reduce) lasts longer than that, whatever it is blocked in. It is the backstop for a
  wait that no timeout covers. `StepWatchdog` puts it around each training step after a process's
  first, which carries one-off costs (workers starting, compilation).

A rank killed on the same machine resets its sockets, so gloo on the survivors fails at once
("Connection reset by peer"); a rank that hangs (stopped, swapping, a dead node behind a switch)
is found by the timeout. Either way `lost_rank_error` turns torch's error into a `PipelineError`
naming the rank, the step and the checkpoint the rerun will resume from; the launcher, which sees
a rank exit non-zero, stops the others and exits non-zero itself.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import timedelta

from pipeline.common.errors import PipelineError

DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0
"""Five minutes: longer than any single collective of a healthy run (rank 0 exporting or converting
a checkpoint while the others wait at a barrier is the longest), far shorter than torch's 30."""

LOST_RANK_EXIT_CODE = 3
"""The status a rank exits with when the watchdog ends it (a `PipelineError` exits 2)."""

# What gloo and NCCL say when a peer is gone or silent (torch raises RuntimeError, DistBackendError
# or DistNetworkError, depending on the version and the backend).
_LOST_PEER = re.compile(r"Connection (reset|closed|refused)|Broken pipe|Timed out waiting|timed out|"
                        r"[Ww]atchdog|NCCL (error|communicator was aborted)|ProcessGroupGloo|gloo/transport|"
                        r"Socket Timeout|recvBytes|sendBytes|DistNetworkError|DistBackendError")


def collective_timeout(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def is_lost_peer(err: BaseException) -> bool:
    """True when `err` is a collective failing because another rank died or stopped answering."""
    import torch.distributed as dist

    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    return isinstance(err, RuntimeError) and bool(_LOST_PEER.search(str(err)))


def lost_rank_message(rank: int, world_size: int, where: str, timeout_s: float, resume_from: str, cause: str) -> str:
    return (f"rank {rank} of {world_size} lost contact with the other ranks {where}: {cause}. Another rank died "
            f"or stopped answering (its own log, or the launcher's, says which); this rank gives up after at most "
            f"{timeout_s:g} s (train.collective_timeout_s). {resume_from}")


def lost_rank_error(err: BaseException, rank: int, world_size: int, where: str, timeout_s: float,
                    resume_from: str) -> PipelineError:
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    first_line = re.sub(r"^\[[^\]]*\]\s*", "", first_line)  # gloo's source-file prefix
    first_line = first_line.split(". ")[0].rstrip(".")[:300]  # and its advice that follows
    return PipelineError(lost_rank_message(rank, world_size, where, timeout_s, resume_from,
                                           f"{type(err).__name__}: {first_line}"))


class RankWatchdog:
    """Ends this process when a guarded section runs past `timeout_s` (a collective blocked for good).

    The loop wraps each step in `guard("step N")`; a daemon thread checks the deadline. On expiry it
    prints the message from `explain(what)` and calls `os._exit`: the blocked thread holds locks
    inside the backend, so a normal exit could block too.
    """

    def __init__(self, timeout_s: float, explain: Callable[[str], str], poll_s: float | None = None):
        self.timeout_s = timeout_s
        self.explain = explain
        self.poll_s = poll_s if poll_s is not None else min(1.0, timeout_s / 10)
        self._lock = threading.Lock()
        self._what: str | None = None
        self._deadline = 0.0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rank-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def guard(self, what: str) -> Iterator[None]:
        with self._lock:
            self._what, self._deadline = what, time.monotonic() + self.timeout_s
        try:
            yield
        finally:
            with self._lock:
                self._what = None

    def _watch(self) -> None:
        while not self._stopped.wait(self.poll_s):
            with self._lock:
                what, late = self._what, self._what is not None and time.monotonic() > self._deadline
            if late:
                print(f"error: {self.explain(what)}", file=sys.stderr, flush=True)
                os._exit(LOST_RANK_EXIT_CODE)

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)


class StepWatchdog:
    """With several ranks, a watchdog around each step after the process's first: a thread that ends this rank when
    a step outlasts `timeout_s`, its message saying where a rerun resumes (`resume_hint`)."""

    def __init__(self, first_step: int, rank: int, world_size: int, timeout_s: float, resume_hint: Callable[[], str]):
        self.first_step, self.watchdog = first_step, None
        if world_size > 1:
            self.watchdog = RankWatchdog(timeout_s, lambda where: lost_rank_message(
                rank, world_size, where, timeout_s, resume_hint(), f"the step has waited {timeout_s:g} s"))

    def around(self, step: int) -> AbstractContextManager:
        """Guard optimizer step `step` (0-based, about to run)."""
        if self.watchdog is None or step <= self.first_step:
            return nullcontext()
        return self.watchdog.guard(f"at step {step + 1}")

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.close()
