"""A run folder is held through the kernel's lock by one live process: a second is refused, naming the holder; the
lock of a holder that ended, however it ended, is free at once; a SLURM requeue takes its earlier incarnation's
folder at once; a file system whose locks do not work is refused unless the risk is accepted."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers import ROOT, holder_process

from pipeline.common.errors import PipelineError
from pipeline.common.folder_lock import (
    LOCK_FILE,
    FolderLock,
    Holder,
    mount_of,
    node_local_locks,
    refused_to_another_process,
)

# A holder that forks a child first, as a trainer forks its data loader workers: the child must not keep the
# folder held once the trainer is killed. The child says on stderr (its own pipe: on stdout its line could interleave
# with the parent's pid) when it runs its own code, which is after filelock's fork hook has closed its copy of the
# lock: a trainer is killed long after its workers started, and on a loaded machine a child may not have been
# scheduled yet when its parent dies.
HOLD_WITH_CHILD = ("import os, sys, time; from pipeline.common.folder_lock import FolderLock; "
                   "FolderLock(sys.argv[1]).acquire(); child = os.fork()\n"
                   "if child == 0: print('child running', file=sys.stderr, flush=True); time.sleep(120); os._exit(0)\n"
                   "print(child, flush=True); time.sleep(120)")

# One contender of the race: for each folder read from stdin, take it and print who won or who refused it.
CONTENDER = ("import json, os, sys; from pipeline.common.errors import PipelineError; "
             "from pipeline.common.folder_lock import FolderLock\n"
             "for line in sys.stdin:\n"
             "    try:\n"
             "        lock = FolderLock(line.strip()).acquire(); print(json.dumps(['won', os.getpid(), "
             "lock.taken_over.pid]), flush=True); sys.stdin.readline(); lock.release(); print('released', flush=True)\n"
             "    except PipelineError as err:\n"
             "        print(json.dumps(['refused', os.getpid(), str(err)]), flush=True); sys.stdin.readline(); "
             "print('released', flush=True)\n")


def dead_holders_lock(folder, pid: int = 999_999, **slurm) -> Holder:
    """A lock left by a holder on this host that ended without releasing it: its name in run.lock, the kernel's lock
    free."""
    folder.mkdir(parents=True, exist_ok=True)
    holder = Holder(socket.gethostname(), pid, slurm.get("job"), slurm.get("restart"), "2026-01-01T00:00:00+00:00")
    (folder / LOCK_FILE).write_text(json.dumps(holder.__dict__))
    return holder


def test_a_second_process_is_refused_naming_the_holder_and_takes_over_at_once_after_kill_9(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLD_WITH_CHILD, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "SLURM_JOB_ID": "4242"})
    child = int(proc.stdout.readline())
    assert proc.stderr.readline().strip() == "child running"
    try:
        with pytest.raises(PipelineError, match=rf"another run holds this run folder: pid {proc.pid} on \S+, SLURM "
                                                rf"job 4242 \(since .*\)"):
            FolderLock(tmp_path).acquire()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed = time.monotonic()
        lock = FolderLock(tmp_path).acquire()  # its forked child still lives
        took = time.monotonic() - killed
    finally:
        proc.kill()
        os.kill(child, signal.SIGKILL)
    print(f"kill -9 to takeover: {took * 1000:.1f} ms")
    assert took < 1.0
    assert lock.taken_over.pid == proc.pid and lock.taken_over.slurm_job == "4242"
    lock.release()
    assert list(tmp_path.iterdir()) == []


def test_two_processes_racing_for_a_dead_holders_lock_one_wins_and_the_other_names_it(tmp_path):
    """100 races, each on a folder a dead holder left locked by name only; both contenders take it at once."""
    tries = 100
    contenders = [subprocess.Popen([sys.executable, "-c", CONTENDER], cwd=ROOT, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True) for _ in range(2)]
    winners = []
    try:
        for i in range(tries):
            dead = dead_holders_lock(tmp_path / f"try{i}")
            for proc in contenders:  # both are told at once, then race
                proc.stdin.write(f"{tmp_path / f'try{i}'}\n")
                proc.stdin.flush()
            results = [json.loads(proc.stdout.readline()) for proc in contenders]
            won = [pid for outcome, pid, _ in results if outcome == "won"]
            winners.append(len(won))
            if len(won) == 1:
                (taken_from,) = [detail for outcome, _, detail in results if outcome == "won"]
                (refusal,) = [detail for outcome, _, detail in results if outcome == "refused"]
                assert taken_from == dead.pid
                assert f"another run holds this run folder: pid {won[0]} on " in refusal
            for proc in contenders:  # the winner releases; both wait for the next folder
                proc.stdin.write("next\n")
                proc.stdin.flush()
            assert [proc.stdout.readline().strip() for proc in contenders] == ["released"] * 2
    finally:
        for proc in contenders:
            proc.stdin.close()
            proc.wait(timeout=30)
    print(f"holders per try over {tries} tries: {sorted(set(winners))}")
    assert winners == [1] * tries


def test_a_requeued_job_takes_its_earlier_incarnations_folder_at_once_then_the_kernels_lock(tmp_path, monkeypatch):
    """The earlier incarnation still holds the kernel's lock (here a live process; on a cluster, a lost node whose
    NFS lease has not run out): the requeue goes on at once, and holds the lock once the old one is gone."""
    old = holder_process(tmp_path, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="0")
    try:
        for job, restart in (("4243", "1"), ("4242", "0")):  # another job; the same incarnation again
            monkeypatch.setenv("SLURM_JOB_ID", job)
            monkeypatch.setenv("SLURM_RESTART_COUNT", restart)
            with pytest.raises(PipelineError, match=f"pid {old.pid} on "):
                FolderLock(tmp_path).acquire()
        monkeypatch.setenv("SLURM_JOB_ID", "4242")
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
        started = time.monotonic()
        requeued = FolderLock(tmp_path).acquire()
        took = time.monotonic() - started
        assert requeued.taken_over.pid == old.pid and requeued.taken_over.slurm_restart == 0
        monkeypatch.delenv("SLURM_JOB_ID")
        with pytest.raises(PipelineError, match=rf"pid {os.getpid()} on \S+, SLURM job 4242 restart 1 "):
            FolderLock(tmp_path).acquire()  # a third run is refused, naming the requeued incarnation
    finally:
        old.kill()
        old.wait()
    print(f"requeue takeover: {took * 1000:.1f} ms")
    assert took < 1.0
    time.sleep(3)  # the old lock is gone: the requeued incarnation now holds the kernel's lock itself
    with pytest.raises(PipelineError, match=rf"pid {os.getpid()} on \S+, SLURM job 4242 restart 1 "):
        FolderLock(tmp_path).acquire()
    requeued.release()
    assert list(tmp_path.iterdir()) == []


def test_a_lock_left_by_a_requeued_job_is_taken_over(tmp_path, monkeypatch):
    left = dead_holders_lock(tmp_path, job="4242", restart=1)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    lock = FolderLock(tmp_path).acquire()
    assert lock.taken_over == left
    assert Holder.parse((tmp_path / LOCK_FILE).read_text()).slurm_restart == 2
    lock.release()


def test_a_file_system_without_locks_is_refused_and_the_flag_accepts_the_risk(tmp_path, monkeypatch, capsys):
    def no_locks(fd, operation):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(PipelineError, match=r"the file system has no locks \(Function not implemented\).*"
                                            r"train.allow_unlocked_folder true"):
        FolderLock(tmp_path / "run").acquire()
    lock = FolderLock(tmp_path / "run", allow_unlocked=True).acquire()
    assert lock.unlocked and "going on unlocked (train.allow_unlocked_folder)" in capsys.readouterr().err
    assert Holder.parse((tmp_path / "run" / LOCK_FILE).read_text()) == lock.holder  # it still names its holder
    lock.release()
    assert not (tmp_path / "run" / LOCK_FILE).exists()


def test_another_process_is_refused_the_lock_this_one_holds(tmp_path):
    lock = FolderLock(tmp_path).acquire()
    assert refused_to_another_process(tmp_path / LOCK_FILE) is True
    lock.release()
    (tmp_path / LOCK_FILE).touch()
    assert refused_to_another_process(tmp_path / LOCK_FILE) is False


def test_locks_that_lock_nothing_are_refused(tmp_path, monkeypatch):
    import pipeline.common.folder_lock as folder_lock

    monkeypatch.setattr(folder_lock, "refused_to_another_process", lambda path: False)
    with pytest.raises(PipelineError, match="its locks lock nothing"):
        FolderLock(tmp_path).acquire()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_mount_that_keeps_locks_on_its_node_is_refused(tmp_path, monkeypatch):
    import pipeline.common.folder_lock as folder_lock

    monkeypatch.setattr(folder_lock, "mount_of", lambda folder: ("/shared", "nfs", ("rw", "vers=3", "nolock")))
    with pytest.raises(PipelineError, match=r"/shared is mounted nfs with nolock \(its locks are kept on this node"):
        FolderLock(tmp_path).acquire()
    assert not (tmp_path / LOCK_FILE).exists()  # refused: nothing held, nothing named


@pytest.mark.parametrize(("line", "node_local"), [
    ("srv:/export /shared nfs4 rw,vers=4.2,local_lock=none 0 0", False),
    ("srv:/export /shared nfs4 rw,vers=4.2,local_lock=flock 0 0", True),
    ("srv:/export /shared nfs rw,vers=3,nolock 0 0", True),
    ("10.0.0.1@tcp:/fs /shared lustre rw,flock 0 0", False),
    ("10.0.0.1@tcp:/fs /shared lustre rw,localflock 0 0", True),
    ("10.0.0.1@tcp:/fs /shared lustre rw 0 0", True),
])
def test_the_folders_mount_says_whether_its_locks_reach_other_nodes(tmp_path, line, node_local):
    mounts = f"/dev/vda / ext4 rw 0 0\n{line}\n"
    point, fstype, options = mount_of(tmp_path / "shared" / "run", mounts.replace("/shared", str(tmp_path / "shared")))
    assert point == str(tmp_path / "shared")
    assert (node_local_locks(fstype, options) is not None) == node_local
    assert mount_of(tmp_path, mounts)[0] == "/"


def test_a_copy_of_a_folder_this_process_holds_is_taken_over_and_the_original_stays_held(tmp_path):
    """A copied folder carries its holder's name but not the kernel's lock."""
    import shutil

    held = FolderLock(tmp_path / "run").acquire()
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    copy = FolderLock(tmp_path / "copy").acquire()
    assert copy.taken_over is not None and copy.taken_over.pid == os.getpid()
    with pytest.raises(PipelineError, match=f"pid {os.getpid()} on "):
        FolderLock(tmp_path / "run").acquire()
    copy.release()
    held.release()
