"""One live process writes a run folder: a lock file naming its holder, taken over only from a dead one.

Two runs on one folder (a SLURM requeue that starts while the old job still writes, the same command started
twice) would interleave their checkpoints, pruning and ledger lines; databases lock their data folder for the same
reason. `<folder>/run.lock` is written under another name and hard-linked into place, which is atomic and fails if
it exists on local file systems and on NFS alike, so it is never read half written; it holds the holder's host,
pid, process start time and SLURM job. A second process finds it and asks whether the
holder is alive:
- on the same host, by its pid and start time (a pid the kernel has given to another process since is dead);
- on another host, by the lock file's heartbeat: the holder touches it every `HEARTBEAT_S`, and one untouched for
  `STALE_AFTER_S` by the file system's own clock (a file written beside it, so the hosts' clocks need not agree)
  belonged to a process that is gone.
A live holder's folder is refused, naming it; a dead holder's lock is renamed aside (atomic, so of two processes
taking it over at once one wins) and taken. `fcntl` locks are not used: over NFS they depend on the lock daemon,
and a holder that is killed leaves nothing to name.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import psutil

from pipeline.common.errors import PipelineError

LOCK_FILE = "run.lock"
HEARTBEAT_S = 15.0
"""How often a holder touches its lock file."""
STALE_AFTER_S = 120.0
"""A lock on another host untouched this long belonged to a process that is gone."""
_HELD: set[Path] = set()
"""The lock files this process holds now."""


@dataclass(frozen=True)
class Holder:
    """Who holds a folder: enough to find the process, or the job, and stop it."""

    host: str
    pid: int
    started: float
    """The process's start time (seconds since the epoch), which tells it from a later process with its pid."""
    slurm_job: str | None
    since: str

    @classmethod
    def this_process(cls) -> Holder:
        job = os.environ.get("SLURM_JOB_ID")
        if job and os.environ.get("SLURM_ARRAY_TASK_ID"):
            job = f"{os.environ.get('SLURM_ARRAY_JOB_ID', job)}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        return cls(socket.gethostname(), os.getpid(), psutil.Process().create_time(), job,
                   datetime.now(UTC).isoformat(timespec="seconds"))

    def describe(self) -> str:
        job = f", SLURM job {self.slurm_job}" if self.slurm_job else ""
        return f"pid {self.pid} on {self.host}{job} (since {self.since})"

    def alive(self, lock: Path) -> bool:
        if self.host == socket.gethostname():
            try:
                return abs(psutil.Process(self.pid).create_time() - self.started) < 1.0
            except psutil.NoSuchProcess:
                return False
        return _file_system_now(lock.parent) - lock.stat().st_mtime < STALE_AFTER_S


class FolderLock:
    """`folder` held by this process from `acquire` to `release`; `taken_over` names a dead holder it replaced."""

    def __init__(self, folder: str | Path, what: str = "run folder"):
        self.folder, self.what = Path(folder), what
        self.path = self.folder / LOCK_FILE
        self.holder = Holder.this_process()
        self.taken_over: Holder | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def acquire(self, refusal_hint: str = "") -> FolderLock:
        """Hold the folder, or raise a PipelineError naming its live holder (`refusal_hint` says what to do)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(10):  # each round either holds the lock, refuses, or moves a dead holder's aside
            try:
                self._create()
            except FileExistsError:
                holder = self._read_holder()
                if holder is not None and holder.alive(self.path) and not self._left_by_this_process(holder):
                    raise PipelineError(f"{self.folder}: another run holds this {self.what}: {holder.describe()}. "
                                        f"Two runs writing one folder would interleave their checkpoints and "
                                        f"ledger; {refusal_hint or 'wait for it to end or stop it'} ({self.path} "
                                        "names the holder)") from None
                self._move_aside(holder)
                continue
            self._beat = threading.Thread(target=self._heartbeat, name="run-folder-lock", daemon=True)
            self._beat.start()
            _HELD.add(self.path.resolve())
            return self
        raise PipelineError(f"{self.path}: could not take the {self.what}'s lock (other processes kept taking it)")

    def _create(self) -> None:
        """The lock file, whole or not at all: written under another name, then linked to its own (FileExistsError
        when it exists), so no process ever reads a lock half written."""
        staged = self.path.with_name(f"{LOCK_FILE}.{uuid.uuid4().hex[:8]}.tmp")
        staged.write_text(json.dumps(asdict(self.holder)) + "\n", encoding="utf-8")
        try:
            os.link(staged, self.path)
        finally:
            staged.unlink(missing_ok=True)

    def release(self) -> None:
        """Stop the heartbeat and remove the lock, if it is still this process's."""
        self._stop.set()
        _HELD.discard(self.path.resolve())
        if self._beat is not None:
            self._beat.join(timeout=5)
            self._beat = None
        if self._read_holder() == self.holder:
            self.path.unlink(missing_ok=True)

    def _left_by_this_process(self, holder: Holder) -> bool:
        """This process's own lock that no lock of it holds now: a run in this process (a notebook's, a test's) that
        ended without releasing it, or a copy of a folder it holds."""
        return holder == replace(self.holder, since=holder.since) and self.path.resolve() not in _HELD

    def _read_holder(self) -> Holder | None:
        """The lock's holder; None for a lock that cannot be read (a damaged one: nothing names a live holder)."""
        try:
            return Holder(**json.loads(self.path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return None

    def _move_aside(self, holder: Holder | None) -> None:
        aside = self.path.with_name(f"{LOCK_FILE}.dead-{uuid.uuid4().hex[:8]}")
        try:
            self.path.rename(aside)
        except FileNotFoundError:
            return  # another process moved it first; the next round finds its lock, or none
        self.taken_over = holder or Holder("an unknown host", 0, 0.0, None, "an unreadable lock")
        aside.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                pass  # a heartbeat missed is only a later takeover's risk; the run goes on


def _file_system_now(folder: Path) -> float:
    """The file system's clock: the modification time of a file written in `folder` now."""
    probe = folder / f".clock-{uuid.uuid4().hex[:8]}"
    try:
        probe.touch()
        return probe.stat().st_mtime
    except OSError:
        return time.time()
    finally:
        probe.unlink(missing_ok=True)
