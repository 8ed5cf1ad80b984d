"""The loop's cadence: which steps log, evaluate and save, and when the run is done."""

from __future__ import annotations

from pipeline.pretrain.step.cadence import Cadence


def test_periods_fire_on_their_multiples_and_the_last_step_only_logs():
    cadence = Cadence(end_step=12, log_every=5, eval_every=4, save_every=6)
    due = {step: cadence.due(step) for step in range(1, 13)}
    assert [s for s, d in due.items() if d.log] == [5, 10, 12]  # and the last step
    assert [s for s, d in due.items() if d.evaluate] == [4, 8]  # the end evaluates once, in _finish
    assert [s for s, d in due.items() if d.save] == [6]  # the end saves once, in _finish
    assert not due[1].any and due[4].any
    assert [s for s in range(14) if cadence.done(s)] == [12, 13]


def test_eval_every_zero_evaluates_only_at_the_end():
    cadence = Cadence(end_step=8, log_every=1, eval_every=0, save_every=1000)
    assert not any(cadence.due(s).evaluate for s in range(1, 9))
