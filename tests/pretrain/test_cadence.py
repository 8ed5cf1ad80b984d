"""Each component beside the loop says when it acts: the run log logs, the validation evaluates, the checkpointer
saves; the loop checks the losses when any of them is due, or a stop is voted."""

from __future__ import annotations

from types import SimpleNamespace

from pipeline.common.processes.topology import Topology
from pipeline.pretrain.checkpointer import Checkpointer
from pipeline.pretrain.config import CheckpointConfig, DataConfig, PretrainConfig, TrainConfig
from pipeline.pretrain.report.run_log import RunLog
from pipeline.pretrain.report.validation import Validation

RANK_0 = Topology(0, 0, 1, False)


def components(end_step: int, log_every: int, eval_every: int, save_every: int):
    config = PretrainConfig(data=DataConfig(shards="shards", tokenizer="tokenizer"),
                            train=TrainConfig(max_steps=end_step, log_every=log_every, eval_every=eval_every),
                            checkpoint=CheckpointConfig(every=save_every))
    plan = SimpleNamespace(config=config, end_step=end_step)
    log = RunLog(plan, RANK_0)
    checkpointer = Checkpointer(config, RANK_0, log)
    checkpointer.plan = plan
    return log, Validation(plan, RANK_0, log, tokenizer=None), checkpointer


def test_periods_fire_on_their_multiples_and_the_last_step_only_logs():
    log, validation, checkpointer = components(end_step=12, log_every=5, eval_every=4, save_every=6)
    steps = range(1, 13)
    assert [s for s in steps if log.due(s)] == [5, 10, 12]  # and the last step
    assert [s for s in steps if validation.due(s)] == [4, 8]  # the end evaluates once, in Pretrainer.finish
    assert [s for s in steps if checkpointer.due(s)] == [6]  # the end saves once, in Pretrainer.finish


def test_eval_every_zero_evaluates_only_at_the_end():
    _, validation, _ = components(end_step=8, log_every=1, eval_every=0, save_every=1000)
    assert not any(validation.due(s) for s in range(1, 9))
