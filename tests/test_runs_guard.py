"""The guard that fails a test touching the checkout's runs/ sees the test's own process and the ones it starts."""

from __future__ import annotations

import os
import subprocess
import sys

import checkout_runs
from helpers import CHECKOUT_RUNS

NEVER_THERE = CHECKOUT_RUNS / "never-there" / "complete.json"


def test_a_read_in_the_test_process_is_found_with_the_line_that_made_it():
    try:
        NEVER_THERE.read_text()  # the audit event comes before the file system answers
    except FileNotFoundError:
        pass
    found = checkout_runs.take_findings()  # taken here, so the guard's own check passes
    assert len(found) == 1 and found[0].startswith(f"open {NEVER_THERE}")
    assert "NEVER_THERE.read_text()" in found[0]


def test_a_listing_by_a_process_the_test_starts_is_found_with_its_command_line():
    code = f"import os\ntry:\n    os.listdir({str(NEVER_THERE.parent)!r})\nexcept FileNotFoundError:\n    pass"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))
    found = checkout_runs.take_findings()
    assert len(found) == 1 and found[0].startswith(f"os.listdir {NEVER_THERE.parent} (process ")
    assert "-c" in found[0]


def test_a_relative_path_counts_from_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mine.txt").write_text("a test's own runs/ folder is no one's")
    assert checkout_runs.take_findings() == []
    monkeypatch.chdir(CHECKOUT_RUNS.parent)
    try:
        open("runs/never-there.txt").close()
    except FileNotFoundError:
        pass
    found = checkout_runs.take_findings()
    assert len(found) == 1 and found[0].startswith(f"open {CHECKOUT_RUNS / 'never-there.txt'}")
