"""schedules_and_optimizers' figures: loss spikes, and the schedule table's gap to linear decay."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules, as when run

import schedules_and_optimizers as bench  # noqa: E402


def test_a_spike_is_a_step_whose_loss_rises_more_than_half_a_nat_over_the_step_before():
    assert bench.count_spikes({1: 9.0, 2: 8.0, 3: 8.6, 4: 8.5, 5: 9.01, 6: 9.4}) == 2  # steps 3 (+0.6) and 5 (+0.51)
    assert bench.count_spikes({1: 9.0, 2: 9.5, 3: 10.0}) == 0  # +0.5 is not more than 0.5
    assert bench.count_spikes({}) == 0


def run(part: str, arm: str, seed: int, final: float | None, ended: str = "finished") -> dict:
    return {"part": part, "arm": arm, "seed": seed, "final_val_loss": final, "ended": ended, "steps": 10,
            "spikes": 1}


def test_the_schedule_table_gives_each_arms_median_range_and_gap_to_linear():
    runs = [run("schedules", "linear", s, v) for s, v in ((1, 6.0), (2, 6.2), (3, 6.1))]
    runs += [run("schedules", "wsd-1-sqrt", s, v) for s, v in ((1, 5.9), (2, 6.0), (3, 5.8))]
    runs.append(run("optimizers", "adamw-lr-x3", 1, None, ended="diverged"))
    rows = bench.schedule_rows(runs)
    assert [(r["schedule"], r["median"], r["range"], r["median − linear"]) for r in rows] == [
        ("linear", "6.100", "6.000–6.200", "+0.000"), ("wsd-1-sqrt", "5.900", "5.800–6.000", "-0.200")]
    (optimizer,) = bench.optimizer_rows(runs)
    assert optimizer["ended"] == "diverged at step 10" and optimizer["final validation loss"] == "—"
    assert bench.markdown(rows).splitlines()[0].startswith("| schedule | seeds |")
