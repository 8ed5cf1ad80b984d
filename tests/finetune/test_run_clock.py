"""A run's clock charges each moment to the innermost phase open, so its phases add up to the run's time."""

from __future__ import annotations

import time

from pipeline.finetune.loop.clock import PHASES, RunClock, summary_line


def busy(seconds: float) -> None:
    """Spend `seconds` of this process's CPU."""
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass


def test_time_goes_to_the_innermost_phase_and_the_phases_add_up(tmp_path):
    clock = RunClock(started=time.time() - 2.0)  # the process started 2 s before the clock: its start-up
    with clock.phase("model set-up"):
        busy(0.05)
        with clock.phase("tokenization"):
            busy(0.1)
        busy(0.05)
    busy(0.05)  # in no phase: other
    record = clock.write(tmp_path / "timings.json")
    cpu, wall = record["cpu_s"], record["wall_s"]
    assert list(cpu) == list(PHASES) and wall["start-up"] >= 2.0
    assert 0.1 <= cpu["model set-up"] < 0.15 and 0.1 <= cpu["tokenization"] < 0.15  # not the nested 0.1 twice
    assert 0.05 <= cpu["other"] < 0.1 and cpu["evaluation"] == 0.0
    assert abs(sum(cpu.values()) - record["total_cpu_s"]) < 0.02
    assert summary_line(record).startswith("time (CPU s): start-up ")
    assert "evaluation" not in summary_line(record)  # phases that took nothing are left out
