"""A run folder is held by one live process: a second is refused, naming the holder; a dead holder's lock is taken
over, whether it died on this host (its pid) or on another (its heartbeat)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from helpers import holder_process

from pipeline.common.errors import PipelineError
from pipeline.common.folder_lock import LOCK_FILE, STALE_AFTER_S, FolderLock, Holder


def test_a_second_process_is_refused_naming_the_holder_and_takes_over_once_it_is_killed(tmp_path):
    proc = holder_process(tmp_path, SLURM_JOB_ID="4242")
    try:
        with pytest.raises(PipelineError, match=rf"another run holds this run folder: pid {proc.pid} on \S+, SLURM "
                                                rf"job 4242 \(since .*\)"):
            FolderLock(tmp_path).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    lock = FolderLock(tmp_path).acquire()
    assert lock.taken_over.pid == proc.pid and lock.taken_over.slurm_job == "4242"
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists() and list(tmp_path.iterdir()) == []


def test_a_lock_from_another_host_is_alive_while_its_heartbeat_is(tmp_path):
    far = Holder("another-node", 7, 1.0, None, "2026-01-01T00:00:00+00:00")
    (tmp_path / LOCK_FILE).write_text(json.dumps(far.__dict__))
    with pytest.raises(PipelineError, match="pid 7 on another-node"):
        FolderLock(tmp_path).acquire()
    stale = time.time() - STALE_AFTER_S - 60
    os.utime(tmp_path / LOCK_FILE, (stale, stale))
    lock = FolderLock(tmp_path).acquire()
    assert lock.taken_over == far
    lock.release()


def test_a_pid_the_kernel_gave_to_another_process_is_a_dead_holder(tmp_path):
    recycled = Holder.this_process()
    recycled = Holder(recycled.host, recycled.pid, recycled.started - 1000.0, None, recycled.since)
    (tmp_path / LOCK_FILE).write_text(json.dumps(recycled.__dict__))
    lock = FolderLock(tmp_path).acquire()
    assert lock.taken_over == recycled
    lock.release()


def test_a_copy_of_a_folder_this_process_holds_is_taken_over_and_the_original_stays_held(tmp_path):
    """A lock naming this very process that no lock of it holds now was left by a run of this process that ended
    without releasing it (a notebook's, a test's), or copied with its folder."""
    import shutil

    held = FolderLock(tmp_path / "run").acquire()
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    copy = FolderLock(tmp_path / "copy").acquire()
    assert copy.taken_over is not None and copy.taken_over.pid == os.getpid()
    with pytest.raises(PipelineError, match=f"pid {os.getpid()} on "):
        FolderLock(tmp_path / "run").acquire()
    copy.release()
    held.release()
