"""What a user sees on screen: the stages and figures, with the frameworks' chatter kept in log files.

Two places make the noise. In a launcher's own process, `quiet_frameworks()` lowers DeepSpeed's
and MLflow's logging to warnings, hides transformers' weight-loading bars and MLflow's artifact
bars, and ignores the known FutureWarnings (each by its message and module, never a whole
category). The main job runs every stage as a command: `run_logged()` writes the command's whole
output to a log file and shows on screen only the lines `ScreenFilter` lets through (all of them
with --verbose).
"""

from __future__ import annotations

import codecs
import logging
import os
import re
import shlex
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO

# Warnings seen in the main job that say nothing to a user of this pipeline: (category, message
# regex, module regex), each with its source. The screen filter and the in-process filters both
# read this list.
KNOWN_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    # DeepSpeed's comm layer still calls the collective torch 2.13 renamed; nothing a user can change.
    (FutureWarning, r"`torch\.distributed\.all_gather_into_tensor` is deprecated", r"torch\.distributed.*"),
)

# Lines that are framework bookkeeping, hidden on screen unless --verbose (they stay in the log).
_NOISE = re.compile("|".join((
    r"^\[[\d\-: ,]+\] \[(DEBUG|INFO)\] ",                         # DeepSpeed's launcher and engine INFO logs
    r"^\[[\d\-: ,]+\] \[WARNING\] \[real_accelerator\.py",        # "Setting accelerator to CPU": expected here
    r"^\[[\d\-: ,]+\] \[WARNING\] \[runner\.py:\d+:fetch_hostfile\]",  # no hostfile: one machine, as intended
    r"^DeepSpeed deepspeed\.ops\.\S+ built successfully",         # DeepSpeed's print after loading its comm op
    r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d INFO mlflow",                # MLflow creating or migrating its database
    # DeepSpeed's zero_to_fp32 narrating the export's consolidation.
    r"^(Processing zero checkpoint|Parsing checkpoint created by|Detected checkpoint of type|Reconstructed fp32)",
    r"^(Loading weights|Loading checkpoint shards|Writing model shards)",  # transformers' load and save bars
    # MLflow copying a logged model's files into the model (`log_model`'s artifacts): a bar per seed.
    r"^Downloading artifacts: ",
)))
_PYTHON_WARNING = re.compile(r"^\S.*:\d+: (\w+Warning): (.*)$")
# Where a DeepSpeed log record or a Python warning starts.
_LINE_START = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\] \[|/\S+\.py:\d+: \w+Warning: ")


def _is_known_warning(category: str, message: str) -> bool:
    return any(category == known.__name__ and re.match(pattern, message) for known, pattern, _ in KNOWN_WARNINGS)


class ScreenFilter:
    """Decide line by line what reaches the screen; a hidden Python warning hides its source line too."""

    def __init__(self) -> None:
        self._in_hidden_warning = False

    def shows(self, line: str) -> bool:
        text = line.rstrip("\r\n")
        if self._in_hidden_warning and text.startswith("  "):  # the warning's quoted source line
            return False
        self._in_hidden_warning = False
        warning = _PYTHON_WARNING.match(text)
        if warning and _is_known_warning(warning.group(1), warning.group(2)):
            self._in_hidden_warning = True
            return False
        return not _NOISE.search(text)


def run_logged(args: list[str], log: Path, *, verbose: bool = False, screen: IO[str] | None = None,
               on_start: Callable[[subprocess.Popen], None] | None = None, **popen) -> int:
    """Run a command with stdout and stderr merged into `log` (all of it); echo what the screen should see.

    The log is appended to, each run under a `# <time> $ <command>` line, so a rerun keeps the
    first run's log. Progress bars (`\\r` updates) go to the screen as they come, and only their
    final state to the log. Returns the command's exit code. Set PYTHONUNBUFFERED in the child's
    env so its prints and warnings arrive in the order they were made. `on_start(proc)` is called
    once the command has started (a caller that forwards signals needs its pid).
    """
    screen = screen or sys.stdout
    shown = ScreenFilter()
    bar_on_screen = 0  # the length of the progress bar the cursor sits at the start of, if any

    def emit(text: str, line_end: bool) -> None:
        nonlocal bar_on_screen
        if line_end:
            file.write(text + "\n")
        if verbose or (text and shown.shows(text)) or (line_end and bar_on_screen and not text):
            if line_end and text and bar_on_screen > len(text):
                screen.write(" " * bar_on_screen + "\r")  # a line over a longer bar: blank the bar first
            screen.write(text + ("\n" if line_end else "\r"))
            screen.flush()
            bar_on_screen = 0 if line_end else max(len(text), 1)

    log.parent.mkdir(parents=True, exist_ok=True)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with open(log, "a", encoding="utf-8", buffering=1) as file, subprocess.Popen(  # line by line: tail -f works
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen) as proc:
        file.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')} $ {shlex.join(map(str, args))}\n")
        if on_start is not None:
            on_start(proc)
        pending, after_bar = "", False
        while chunk := proc.stdout.read1(1 << 16):
            pending += decoder.decode(chunk)
            # Pieces end in "\n" (a line) or "\r" (a progress-bar update).
            for piece in re.findall(r"[^\r\n]*(?:\r\n|\n|\r)", pending):
                pending = pending[len(piece):]
                line_end, text = piece.endswith("\n"), piece.rstrip("\r\n")
                # A bar redraws with "\r" first, so a line logged during a bar arrives glued to the
                # bar's last state: split it off where a log record or a warning starts.
                if after_bar and line_end and (start := _LINE_START.search(text, 1)):
                    emit(text[:start.start()], line_end=False)
                    text = text[start.start():]
                emit(text, line_end)
                after_bar = not line_end
        if pending:
            emit(pending, line_end=True)
        if bar_on_screen:
            screen.write("\n")
        screen.flush()
        return proc.wait()


def quiet_frameworks(verbose: bool = False, *, transformers: bool = True) -> None:
    """In a launcher's process: DeepSpeed and MLflow at warnings, no known FutureWarnings, no weight bars.

    `verbose` leaves every framework at its own defaults. Call it first thing, before the frameworks
    are imported. `transformers=False` skips hiding its weight-loading bars, for launchers that load
    no model and should not pay its import (seconds).
    """
    if verbose:
        return
    for category, message, module in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    # DeepSpeed's logger defaults to warnings, but a DeepSpeed config's "log_level" or its launcher can raise it.
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    for handler in logging.getLogger("DeepSpeed").handlers:
        handler.setLevel(logging.WARNING)
    # MLflow reads this when imported; its INFO lines narrate creating and migrating the database.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # MLflow's artifact bars ("Downloading artifacts" as it copies a logged model's files; read at each copy).
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if transformers:
        # Not HF_HUB_DISABLE_PROGRESS_BARS: a hub download of a large model should still show progress.
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
