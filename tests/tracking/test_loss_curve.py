"""Time-to-loss: where a validation curve first reaches a loss, and training time without evaluation time."""

from __future__ import annotations

import pytest

from pipeline.tracking.loss_curve import EvalPoint, curve_from_metrics, first_crossing


def test_crossing_is_interpolated_between_the_evaluations_either_side():
    curve = [EvalPoint(100, 10.0, 7.0), EvalPoint(200, 20.0, 6.5), EvalPoint(300, 30.0, 5.5)]
    crossing = first_crossing(curve, 6.0)
    assert crossing.step == pytest.approx(250)
    assert crossing.seconds == pytest.approx(25.0)


def test_the_first_crossing_counts_even_if_the_loss_rises_again():
    curve = [EvalPoint(1, 1.0, 6.2), EvalPoint(2, 2.0, 5.8), EvalPoint(3, 3.0, 6.4), EvalPoint(4, 4.0, 5.0)]
    assert first_crossing(curve, 6.0).step == pytest.approx(1.5)


def test_a_curve_already_below_at_its_first_evaluation_answers_that_evaluation():
    assert first_crossing([EvalPoint(50, 5.0, 4.0)], 5.0) == EvalPoint(50, 5.0, 5.0)


def test_a_curve_that_never_reaches_the_loss_has_no_crossing():
    assert first_crossing([EvalPoint(1, 1.0, 7.0), EvalPoint(2, 2.0, 6.01)], 6.0) is None
    assert first_crossing([], 6.0) is None


def test_evaluation_time_is_left_out_of_the_training_time():
    launched = 1000.0
    records = [
        {"step": 1, "time": 1010.0, "train/loss": 9.0},
        {"step": 2, "time": 1012.0, "train/loss": 8.0},
        {"step": 2, "time": 1015.0, "eval/mlm_loss": 7.5},  # 3 s evaluating
        {"step": 3, "time": 1017.0, "train/loss": 7.0},
        {"step": 4, "time": 1019.0, "train/loss": 6.5},
        {"step": 4, "time": 1020.0, "eval/mlm_loss": 6.4},  # 1 s evaluating
    ]
    curve = curve_from_metrics(records, launched)
    assert curve == [EvalPoint(2, 12.0, 7.5), EvalPoint(4, 16.0, 6.4)]
