"""One live process writes a run folder: the kernel's lock on `<folder>/run.lock`, held for the whole run.

Two runs on one folder (a SLURM requeue that starts while the old job still writes, the same command started
twice) would interleave their checkpoints, pruning and ledger lines; databases lock their data folder for the same
reason. The lock is `flock`, taken through `filelock`: the kernel (or the NFS server, for a client's lock)
releases it when the holding process ends, however it ends, so no guess about a holder's liveness is needed.
`filelock` also closes the lock's descriptor in forked children (data loader workers), so a worker that outlives a
killed trainer does not keep the folder held.

`run.lock` also names its holder (host, pid, SLURM job and restart count, start time), so that a refusal can say
whom to stop. The holder writes the name after taking the lock, and a process that finds the lock held reads it,
both under a short second lock (`run.lock.gate`): without it, a process that lost a race for a dead holder's lock
could read the dead holder's name before the winner had written its own. A name left in `run.lock` when the lock is
free belonged to a holder that ended without releasing it (killed, or its node lost): the next run takes the
folder at once and says whose it was (`taken_over`).

A SLURM requeue of the same job (the same job id, a higher `SLURM_RESTART_COUNT`) takes the folder at once even
while the kernel still holds the old incarnation's lock: SLURM has ended that incarnation, and an NFS server keeps
the lock of a lost node until its lease runs out (about 90 s). The new incarnation names itself in `run.lock` and
takes the kernel's lock as soon as it is free.

A file system whose locks do not work across nodes (no `flock` at all, NFS mounted `nolock` or `local_lock`,
Lustre's `localflock`), or whose locks do not keep a second process out, is refused with a message naming the
mount; the caller may accept the risk (`allow_unlocked`, pretraining's `train.allow_unlocked_folder`).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path

from filelock import FileLock, Timeout

from pipeline.common.errors import PipelineError

LOCK_FILE = "run.lock"
GATE_FILE = "run.lock.gate"
GATE_TIMEOUT_S = 120.0
"""How long a process waits for the gate, held for milliseconds by a process taking or reading the lock; only a
process lost while holding it (its node gone, until the NFS server's lease of about 90 s runs out) holds it longer."""
REQUEUE_POLL_S = 1.0
"""How often a requeued job that took its old incarnation's folder tries to take the kernel's lock."""
_NO_LOCKS = {errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOLCK, errno.EINVAL}
"""What `flock` says on a file system that has no locks."""


@dataclass(frozen=True)
class Holder:
    """Who holds a folder: enough to find the process, or the job, and stop it."""

    host: str
    pid: int
    slurm_job: str | None
    slurm_restart: int | None
    """SLURM_RESTART_COUNT: how many times SLURM has requeued the job (None outside SLURM)."""
    since: str

    @classmethod
    def this_process(cls) -> Holder:
        job = os.environ.get("SLURM_JOB_ID")
        if job and os.environ.get("SLURM_ARRAY_TASK_ID"):
            job = f"{os.environ.get('SLURM_ARRAY_JOB_ID', job)}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        restart = os.environ.get("SLURM_RESTART_COUNT", "0" if job else "")
        return cls(socket.gethostname(), os.getpid(), job, int(restart) if restart.isdigit() else None,
                   datetime.now(UTC).isoformat(timespec="seconds"))

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """The holder named by a lock file's `text`; None for an empty or damaged one."""
        try:
            data = json.loads(text)
            holder = cls(**{f.name: data.get(f.name) for f in fields(cls)})
        except (ValueError, TypeError, AttributeError):
            return None
        return holder if isinstance(holder.host, str) and isinstance(holder.pid, int) else None

    def describe(self) -> str:
        job = f", SLURM job {self.slurm_job}" if self.slurm_job else ""
        job += f" restart {self.slurm_restart}" if job and self.slurm_restart else ""
        return f"pid {self.pid} on {self.host}{job} (since {self.since})"

    def requeue_of(self, other: Holder) -> bool:
        """Whether this process is a later incarnation of `other`'s SLURM job: SLURM ended `other` before it
        started this one."""
        return (self.slurm_job is not None and self.slurm_job == other.slurm_job
                and (self.slurm_restart or 0) > (other.slurm_restart or 0))


class FolderLock:
    """`folder` held by this process from `acquire` to `release`; `taken_over` names a holder that ended without
    releasing it. `allow_unlocked`: go on, with a warning, where the file system's locks do not work."""

    def __init__(self, folder: str | Path, what: str = "run folder", allow_unlocked: bool = False):
        self.folder, self.what, self.allow_unlocked = Path(folder), what, allow_unlocked
        self.path = self.folder / LOCK_FILE
        self.holder = Holder.this_process()
        self.taken_over: Holder | None = None
        self.unlocked: str | None = None
        """Why the kernel's lock does not guard this folder (only with `allow_unlocked`)."""
        self._lock = FileLock(self.path, blocking=False, thread_local=False, fallback_to_soft=False,
                              on_acquired=self._name_holder)
        self._gate = FileLock(self.folder / GATE_FILE, timeout=GATE_TIMEOUT_S, thread_local=False,
                              fallback_to_soft=False)
        self._stop = threading.Event()
        self._waiter: threading.Thread | None = None

    def acquire(self, refusal_hint: str = "") -> FolderLock:
        """Hold the folder, or raise a PipelineError naming its live holder (`refusal_hint` says what to do)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._gated():
            try:
                self._lock.acquire()
            except Timeout:
                holder = self._read_holder()
                if holder is None or not self.holder.requeue_of(holder):
                    named = holder.describe() if holder else f"a process that has not named itself in {self.path}"
                    raise PipelineError(f"{self.folder}: another run holds this {self.what}: {named}. Two runs "
                                        f"writing one folder would interleave their checkpoints and ledger; "
                                        f"{refusal_hint or 'wait for it to end or stop it'} ({self.path} names the "
                                        "holder)") from None
                self._take_from_earlier_incarnation(holder)
                return self
            except OSError as err:
                if err.errno not in _NO_LOCKS:
                    raise
                self._refuse_or_go_on_unlocked(f"the file system has no locks ({os.strerror(err.errno)})")
                self._write_name()
                return self
            if (why := self._locks_do_not_work()) is not None:
                self._refuse_or_go_on_unlocked(why)
        return self

    def release(self) -> None:
        """Free the folder: the kernel's lock and the holder's name, if they are still this process's."""
        self._stop.set()
        if self._waiter is not None:
            self._waiter.join(timeout=5)
            self._waiter = None
        with self._gated():
            if self._lock.is_locked:
                _unlink_then_release(self._lock)
            elif self._named_here():  # named without the kernel's lock (a requeue, a file system without locks)
                self.path.unlink(missing_ok=True)

    @contextmanager
    def _gated(self) -> Iterator[None]:
        """Inside: no other process takes the lock, names itself in it, or reads its name."""
        try:
            self._gate.acquire()
        except Timeout:
            raise PipelineError(f"{self.folder / GATE_FILE}: another process kept it locked for {GATE_TIMEOUT_S:g} s "
                                f"(it is held for milliseconds while a run takes {self.path}); its node may be "
                                "lost, in which case the file server frees it when that node's lease ends: try "
                                "again") from None
        except OSError as err:
            if err.errno not in _NO_LOCKS:
                raise
            yield  # no locks here: taking the lock itself is refused, or goes on unlocked, just after
            return
        try:
            yield
        finally:
            _unlink_then_release(self._gate)

    def _name_holder(self, fd: int) -> None:
        """Called by filelock with the lock's descriptor once it is held: a name left there belonged to a holder
        that ended without releasing it; this process writes its own."""
        previous = os.pread(fd, 1 << 16, 0).decode("utf-8", errors="replace")
        if previous.strip() and self.taken_over is None:  # None: not already taken from an earlier incarnation
            self.taken_over = Holder.parse(previous) or Holder("an unknown host", 0, None, None, "a damaged lock file")
        data = (json.dumps(asdict(self.holder)) + "\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)

    def _write_name(self) -> None:
        self.path.write_text(json.dumps(asdict(self.holder)) + "\n", encoding="utf-8")

    def _read_holder(self) -> Holder | None:
        """The holder `run.lock` names; None where it names none (empty, damaged or unreadable). Only while this
        process does not hold the kernel's lock: over NFS, closing any descriptor of the file releases it."""
        try:
            return Holder.parse(self.path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            return None

    def _named_here(self) -> bool:
        return self._read_holder() == self.holder

    def _take_from_earlier_incarnation(self, earlier: Holder) -> None:
        """The folder taken from an earlier incarnation of this SLURM job: named now, and the kernel's lock taken as
        soon as the old lock is gone (a process that has not ended yet, a lost node's NFS lease)."""
        self.taken_over = earlier
        self._write_name()
        self._waiter = threading.Thread(target=self._wait_for_kernel_lock, name="run-folder-lock", daemon=True)
        self._waiter.start()

    def _wait_for_kernel_lock(self) -> None:
        while not self._stop.wait(REQUEUE_POLL_S):
            try:
                with self._gated():
                    if not self._named_here():
                        return  # another process named itself meanwhile (a later requeue): it is the folder's now
                    self._lock.acquire()
                    return
            except (Timeout, OSError, PipelineError):
                continue  # still held by the earlier incarnation

    def _locks_do_not_work(self) -> str | None:
        """Why the lock just taken would not keep out a run on another node: the mount keeps locks on this node, or
        another process is not refused the lock (locks that lock nothing)."""
        mount = mount_of(self.folder)
        if mount is not None and (why := node_local_locks(*mount[1:])):
            return f"{mount[0]} is mounted {why}"
        refused = refused_to_another_process(self.path)
        if refused is None:
            return "its locks could not be tested (a second process could not open the lock file)"
        return None if refused else "its locks lock nothing (a second process took the lock this one holds)"

    def _refuse_or_go_on_unlocked(self, why: str) -> None:
        message = (f"{self.folder}: {why}, so a second run on another node could write this {self.what} beside this "
                   f"one")
        if not self.allow_unlocked:
            if self._lock.is_locked:
                _unlink_then_release(self._lock)
            raise PipelineError(f"{message}. Give the run a folder on a file system with working locks (a local disk, "
                                "NFSv4 without local_lock, Lustre mounted with flock), or accept the risk with "
                                "train.allow_unlocked_folder true (docs/slurm-and-faults.md)")
        self.unlocked = why
        print(f"warning: {message}; going on unlocked (train.allow_unlocked_folder)", file=sys.stderr, flush=True)


# Run in a second process: over NFS, flock is a POSIX lock, which this process would share with a second open of the
# file (and lose when that open closed).
_PROBE = """import errno, fcntl, sys
with open(sys.argv[1], "ab") as f:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        sys.exit(0 if err.errno in (errno.EAGAIN, errno.EACCES) else 2)
sys.exit(1)
"""


def refused_to_another_process(path: Path) -> bool | None:
    """Whether another process is refused the lock on `path` that this one holds; None when it cannot tell."""
    try:
        probe = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE, str(path)], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {0: True, 1: False}.get(probe.returncode)


def _unlink_then_release(lock: FileLock) -> None:
    """`lock` released and its file gone (filelock leaves it). Removed first, while still held: a process that
    opened the file before and takes its lock next finds it unlinked and opens the path again (filelock checks),
    so that two processes never hold two files of one name."""
    Path(lock.lock_file).unlink(missing_ok=True)
    lock.release()


# The mount options under which a file system keeps locks on the node that takes them, so that another node's run
# does not see them: NFS's `nolock` and `local_lock=flock|all`, Lustre's `localflock`.
_NODE_LOCAL = {"nfs": ("nolock", "local_lock=flock", "local_lock=all"),
               "nfs4": ("nolock", "local_lock=flock", "local_lock=all"),
               "lustre": ("localflock",)}


def mount_of(folder: Path, mounts: str | None = None) -> tuple[str, str, tuple[str, ...]] | None:
    """(mount point, file system type, options) of the mount that holds `folder`, from `/proc/self/mounts` (or the
    `mounts` text given); None where it cannot be read."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    target, best = str(folder.resolve()), None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        point = parts[1].replace("\\040", " ")
        if (target == point or target.startswith(point.rstrip("/") + "/")) and (
                best is None or len(point) >= len(best[0])):
            best = (point, parts[2], tuple(parts[3].split(",")))
    return best


def node_local_locks(fstype: str, options: tuple[str, ...]) -> str | None:
    """The mount option under which `fstype` keeps locks on this node (another node's run cannot see them)."""
    for option in _NODE_LOCAL.get(fstype, ()):
        if option in options:
            return f"{fstype} with {option} (its locks are kept on this node only)"
    if fstype == "lustre" and "flock" not in options:
        return "lustre without flock (it has no locks shared between nodes)"
    return None
