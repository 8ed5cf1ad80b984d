"""Validation-loss curves against wall time, and when a curve first reaches a loss: time-to-loss comparisons.

A curve is a list of `EvalPoint(step, seconds, loss)`. `seconds` is training wall time: from a
run's launch, less the time spent evaluating, so that recipes evaluated at different cadences
(a batch of 8 evaluates eight times as often per sequence as a batch of 64) pay the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EvalPoint:
    step: float
    seconds: float
    """Wall seconds from the run's launch, evaluation time excluded."""
    loss: float


def first_crossing(curve: Iterable[EvalPoint], threshold: float) -> EvalPoint | None:
    """Where the loss first falls to `threshold`, or None if it never does.

    Linear interpolation in step and seconds between the last evaluation above the threshold and the
    first at or below it; a curve whose first evaluation is already below gives that evaluation
    (there is nothing earlier to interpolate from, so the answer errs late, never early).
    """
    previous = None
    for point in curve:
        if point.loss <= threshold:
            if previous is None:
                return EvalPoint(point.step, point.seconds, threshold)
            f = (previous.loss - threshold) / (previous.loss - point.loss)
            return EvalPoint(previous.step + f * (point.step - previous.step),
                             previous.seconds + f * (point.seconds - previous.seconds), threshold)
        previous = point
    return None


def curve_from_metrics(records: Iterable[Mapping[str, Any]], launched_at: float,
                       loss_key: str = "eval/mlm_loss") -> list[EvalPoint]:
    """The evaluations of a pretraining run's metrics.jsonl (records with `step` and unix `time`).

    The trainer writes a step's record, then evaluates, then writes the evaluation's record, so an
    evaluation took the time between its record and the record before it; that time is removed
    from this and every later point.
    """
    curve, eval_seconds, last_time = [], 0.0, launched_at
    for record in records:
        if loss_key in record:
            eval_seconds += record["time"] - last_time
            curve.append(EvalPoint(record["step"], record["time"] - launched_at - eval_seconds, record[loss_key]))
        last_time = record["time"]
    return curve
