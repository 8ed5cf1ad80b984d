"""architecture_race's findings: margins by minute, and a time ratio that is a bound when an arm missed the target."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules, as when run

import architecture_race as race  # noqa: E402
from result_record import BenchmarkRecord  # noqa: E402


def run(arm: str, losses: list[float]) -> dict:
    """A run evaluated once a minute (training seconds), with the fields the benchmark records."""
    return {"arm": arm, "seed": 1, "steps": 100 * len(losses), "wall_seconds": 600.0, "load_before": [1.0],
            "load_after": [1.0], "curve": [{"step": 100 * (i + 1), "seconds": 60.0 * (i + 1), "loss": loss}
                                           for i, loss in enumerate(losses)]}


def record() -> BenchmarkRecord:
    rec = BenchmarkRecord.__new__(BenchmarkRecord)  # the results only: nothing is written
    rec.results = {}
    return rec


def test_the_margin_at_each_minute_is_the_last_evaluation_by_then():
    rows = race.margins_over_time([run("modernbert", [7.5, 6.5, 5.5])], plateau=7.0, minutes=[0.5, 1, 2.5])
    assert rows == [{"arm": "modernbert", "seed": 1, "0.5 min": None, "1 min": -0.5, "2.5 min": 0.5}]


def test_an_arm_that_never_reached_the_target_gives_a_bound_from_its_training_time_not_the_cap():
    # H = 7.0, target 6.0: ModernBERT crosses it half-way between minutes 2 and 3 (2.5 min); RoBERTa never
    # does, and had trained 4 minutes by its last evaluation, so it took more than 4 ÷ 2.5 = 1.6×.
    runs = [run("modernbert", [7.5, 6.5, 5.5]), run("roberta-prelayernorm", [7.5, 7.0, 6.8, 6.6])]
    rows = [{"arm": "modernbert", "tokens_per_s": 800.0}, {"arm": "roberta-prelayernorm", "tokens_per_s": 1000.0}]
    rec = record()
    race.record_findings(rec, runs, rows, plateau=7.0)
    assert rec.results["headline"]["time to H − 1.0, pre-LN RoBERTa ÷ ModernBERT"]["value"] == "≥ 1.6×"
    assert rec.results["headline"]["tokens/s, ModernBERT ÷ pre-LN RoBERTa"]["value"] == "0.80"


def test_when_both_arms_reach_the_target_the_ratio_is_exact():
    runs = [run("modernbert", [7.5, 6.5, 5.5]), run("roberta-prelayernorm", [7.5, 7.0, 6.5, 6.5, 5.5])]
    rec = record()
    race.record_findings(rec, runs, [], plateau=7.0)
    assert rec.results["headline"]["time to H − 1.0, pre-LN RoBERTa ÷ ModernBERT"]["value"] == "1.8×"  # 4.5 ÷ 2.5
