"""Where a fine-tuning run's time goes: CPU and wall seconds per phase, from the process's start to its report.

Every moment is charged to one phase: `start-up` (the interpreter, the imports and the config checks, until the
runner starts), then the innermost phase open (tokenization inside model set-up is tokenization), and `other`
where none is. CPU is the process's (every thread: MLflow's sender too). The main process writes the sums to
`timings.json` in the run's folder and prints them in one line; benchmarks/finetune_speed.py tabulates them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pipeline.common.atomic_files import write_json_atomic

Phase = Literal["start-up", "tracking", "tokenization", "model set-up", "training steps", "evaluation", "saving",
                "other"]
PHASES: tuple[Phase, ...] = ("start-up", "tracking", "tokenization", "model set-up", "training steps",
                             "evaluation", "saving", "other")
"""`tracking`: MLflow (its import, stores, runs, the model store, the last sends); `saving`: the run's files,
models with their proof and cards; `model set-up`: the model, accelerator, loaders and optimizer of a training."""


def process_started() -> float:
    """When this process started (seconds since the epoch), from psutil (accelerate's dependency)."""
    import psutil

    return psutil.Process().create_time()


class RunClock:
    """The run's phases: `with clock.phase("evaluation"):` charges what runs inside to that phase."""

    def __init__(self, started: float | None = None):
        """`started`: the process's start (epoch seconds); what came before the clock is charged to `start-up`."""
        self.cpu_s: dict[Phase, float] = dict.fromkeys(PHASES, 0.0)
        self.wall_s: dict[Phase, float] = dict.fromkeys(PHASES, 0.0)
        now = time.time()
        self.cpu_s["start-up"] = time.process_time()
        self.wall_s["start-up"] = now - (process_started() if started is None else started)
        self._open: list[Phase] = ["other"]
        self._cpu, self._wall = time.process_time(), time.monotonic()

    def _charge(self) -> None:
        cpu, wall = time.process_time(), time.monotonic()
        self.cpu_s[self._open[-1]] += cpu - self._cpu
        self.wall_s[self._open[-1]] += wall - self._wall
        self._cpu, self._wall = cpu, wall

    @contextmanager
    def phase(self, name: Phase) -> Iterator[None]:
        self._charge()
        self._open.append(name)
        try:
            yield
        finally:
            self._charge()
            self._open.pop()

    def record(self) -> dict:
        """`{"cpu_s": {phase: s}, "wall_s": {...}, "total_cpu_s", "total_wall_s"}`, rounded to 0.01 s."""
        self._charge()
        return {"cpu_s": {k: round(v, 2) for k, v in self.cpu_s.items()},
                "wall_s": {k: round(v, 2) for k, v in self.wall_s.items()},
                "total_cpu_s": round(sum(self.cpu_s.values()), 2), "total_wall_s": round(sum(self.wall_s.values()), 2)}

    def write(self, path: Path) -> dict:
        """Write `record()` to `path`; return it."""
        record = self.record()
        write_json_atomic(path, record)
        return record


def summary_line(record: dict) -> str:
    """`time (CPU s): start-up 5.1, training steps 3.7, …, total 14.2 (wall 16.0)`: the phases that took any."""
    parts = [f"{name} {seconds:.1f}" for name, seconds in record["cpu_s"].items() if seconds >= 0.05]
    return f"time (CPU s): {', '.join(parts)}; total {record['total_cpu_s']:.1f} (wall {record['total_wall_s']:.1f})"
