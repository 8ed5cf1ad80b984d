"""A guard that catches any process of the test suite touching the checkout's `runs/`.

`runs/` is where a user's own runs live (the main job writes `runs/default/`): a test that reads or
writes it passes on a fresh clone and fails after the user's first command (or damages the user's
run). The guard is a `sys.audit` hook (PEP 578) that records every open, listing, creation, rename,
removal or sqlite connection of a path under the forbidden folder. It runs in the pytest process and,
through `sitecustomize.py` beside this file (on `PYTHONPATH`), in every Python process a test starts,
which report into a folder the pytest process reads after each test. A bare `stat` (`Path.exists`)
raises no audit event and is not seen: a test that only asks whether a path exists touches nothing.
"""

from __future__ import annotations

import os
import sys

FORBIDDEN_VARIABLE = "PIPELINE_TESTS_FORBIDDEN_DIR"
REPORT_VARIABLE = "PIPELINE_TESTS_GUARD_REPORTS"

# Audit events whose arguments name paths, and which of their arguments do.
_PATH_ARGUMENTS = {
    "open": (0,), "os.listdir": (0,), "os.scandir": (0,), "os.mkdir": (0,), "os.remove": (0,),
    "os.rmdir": (0,), "os.rename": (0, 1), "os.replace": (0, 1), "os.link": (0, 1), "os.symlink": (0, 1),
    "os.truncate": (0,), "os.chmod": (0,), "os.utime": (0,), "shutil.rmtree": (0,), "shutil.copytree": (0, 1),
    "shutil.copyfile": (0, 1), "shutil.move": (0, 1), "sqlite3.connect": (0,),
}

_state: dict = {"forbidden": None, "found": [], "report": None, "busy": False}


def _as_path(value) -> str | None:
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    elif isinstance(value, os.PathLike):
        value = os.fspath(value)
        value = os.fsdecode(value) if isinstance(value, bytes) else value
    if not isinstance(value, str) or not value or value == ":memory:":
        return None
    return os.path.abspath(value.removeprefix("file:"))


def _hook(event: str, args: tuple) -> None:
    positions = _PATH_ARGUMENTS.get(event)
    if positions is None or _state["busy"]:
        return
    forbidden = _state["forbidden"]
    for i in positions:
        path = _as_path(args[i]) if i < len(args) else None
        if path is not None and (path == forbidden or path.startswith(forbidden + os.sep)):
            _state["busy"] = True  # the report's own writes raise audit events too
            try:
                _record(f"{event} {path}")
            finally:
                _state["busy"] = False
            return


def _record(what: str) -> None:
    if _state["report"] is None:  # the pytest process: the test's own frames say where
        import traceback

        frames = [f for f in traceback.extract_stack()[:-3] if "/_pytest/" not in f.filename
                  and "/pluggy/" not in f.filename]
        _state["found"].append(f"{what}\n" + "".join(traceback.format_list(frames[-6:])))
        return
    line = f"{what} (process {os.getpid()}: {' '.join(sys.argv)[:300]})\n"
    with open(os.path.join(_state["report"], f"{os.getpid()}.txt"), "a", encoding="utf-8") as out:
        out.write(line)


def install(forbidden: str, report: str | None = None) -> None:
    """Watch `forbidden` from now on in this process; `report`: a folder to append findings to (a child process),
    None: keep them for `take_findings` (the pytest process).

    A second call redirects the findings: a pytest worker that pytest-xdist started ran sitecustomize.py with its
    controller's folder, and its conftest then keeps its own findings itself.
    """
    first = _state["forbidden"] is None
    _state.update(forbidden=os.path.abspath(forbidden), report=report)
    if first:
        sys.addaudithook(_hook)  # a hook cannot be removed: one per process


def install_from_environment() -> None:
    """In a process a test started: watch what the pytest process watches, reporting into its folder."""
    forbidden, report = os.environ.get(FORBIDDEN_VARIABLE), os.environ.get(REPORT_VARIABLE)
    if forbidden and report and os.path.isdir(report):
        install(forbidden, report)


def take_findings(report: str | None = None) -> list[str]:
    """What this process and the processes it started recorded since the last call (cleared); `report`: their
    folder (default: the one the environment names)."""
    report = report or os.environ[REPORT_VARIABLE]
    found, _state["found"] = _state["found"], []
    for name in sorted(os.listdir(report)):
        path = os.path.join(report, name)
        with open(path, encoding="utf-8") as lines:
            found += lines.read().splitlines()
        os.remove(path)
    return found
