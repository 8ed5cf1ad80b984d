"""What the run does about the spike guard's findings (spike_guard.py judges): at each check it goes on, notes
the updates it left out, or rolls the run back to a named checkpoint; it stops the run when that no longer helps.
With the guard off, a non-finite loss stops the run here.

- `skip` leaves every outlier's update out (inside the step) and notes them in the run's ledger; it stops the run
  when more than half the window's updates were left out: the loss has moved, not spiked.
- `rollback` leaves each outlier's update out as `skip` does (a false alarm costs one update, and no outlier
  reaches the weights) and goes back after `guard.rollback_after` of them among the last `guard.window` steps, or at
  once after a non-finite loss or norm; where the step cannot leave an update out (ZeRO 1-3 judge after it), at the
  first outlier, whose update only a rollback undoes. It goes back to the newest checkpoint before the first
  outlier, leaving out the batches from the first outlier through the last (`guard.margin` more on each side), as
  `--skip-steps` would. The ledger records it, later checkpoints are set aside (the checkpointer
  plans the run again from the checkpoint), and the same process starts again from it (`Pretrainer.start`). The
  order and dropout are functions of the step, so the steps trained again reach the state the spike met exactly;
  what changes is the batches it meets. (Leaving out everything from the checkpoint, as PaLM did by hand, would
  cost up to `checkpoint.every` batches a rollback.) While no checkpoint lies behind the run there is nothing to go
  back to: the outliers' updates are left out where the step can do so (ZeRO 0) and noted, and the run goes on.
- `guard.max_rollbacks` bounds the rollbacks of one spike: a rollback belongs to the spike of the one before it when
  its first outlier comes within `guard.window` steps of the range that one left out; a clean window re-arms the
  bound. Past it the run stops, naming the steps and what to do.

Rank 0 decides where a rollback goes and every rank takes its decision (a shared file system may show the ranks
different sets of checkpoints for a while), or stops with rank 0's error (common/rank_zero.py); a stop is noted in
the ledger and reported before it is raised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pipeline.common.errors import PipelineError
from pipeline.common.processes.rank_zero import decided_on_rank_zero
from pipeline.common.processes.topology import Topology
from pipeline.data.tokenizer import TokenizerInfo
from pipeline.pretrain.checkpointer import Checkpointer
from pipeline.pretrain.checkpoints.ledger import GaveUpEvent, Ledger, LedgerEvent, RollbackEvent, UpdatesSkippedEvent
from pipeline.pretrain.checkpoints.record import read_record
from pipeline.pretrain.checkpoints.storage import complete_checkpoints, newest_complete
from pipeline.pretrain.guard.spike_guard import Spike, SpikeGuard
from pipeline.pretrain.plan.run_plan import RunPlan
from pipeline.pretrain.report.run_log import RunLog
from pipeline.pretrain.step.step_sync import CheckedLosses


@dataclass(frozen=True)
class Response:
    """What the run does after a check, and what it found: go on (watching outliers, or with no checkpoint to go
    back to), go on with updates left out, roll back, or stop."""

    action: Literal["go on", "skip", "no rollback target", "roll back", "give up"]
    spike: Spike | None = None
    events: tuple[LedgerEvent, ...] = ()
    """What the ledger keeps of it (the updates left out, the rollback, the stop)."""
    plan: RunPlan | None = None
    """roll back: the plan to start again from, its start the checkpoint the rollback names (the checkpointer's)."""
    rollbacks: int = 0
    """roll back: the run's rollbacks so far, this one included."""
    left_out: bool = False
    """skip, no rollback target: the outliers' updates were left out (the step could)."""


GO_ON = Response("go on")


class GiveUp(PipelineError):
    """The guard stops the run, saying why; its event is in the ledger."""


class SpikeResponse:
    """The consequences of the guard's verdicts, on one rank."""

    def __init__(self, guard: SpikeGuard, checkpointer: Checkpointer, log: RunLog, info: TokenizerInfo,
                 topology: Topology):
        self.guard, self.checkpointer, self.log, self.info, self.topology = guard, checkpointer, log, info, topology

    def after_check(self, plan: RunPlan, checked: CheckedLosses | None, step: int) -> Response:
        """What the run does after `step` steps, given the check (None: no check after this step): the ledger and
        the log are told, and a stop raised."""
        if checked is None:
            return GO_ON
        response = self.decide(plan, checked, self.guard.verdict(checked.guard, step), step)
        if response.spike is None:
            return response
        response = self.checkpointer.carry_out(plan, response, self.info)
        self.log.responded(response, step, plan.config)
        if response.action == "give up":
            raise GiveUp(response.events[-1].why)
        return response

    def decide(self, plan: RunPlan, checked: CheckedLosses, spike: Spike | None, step: int) -> Response:
        """The response to `spike` (None: the guard is off) after `step` steps; rank 0 decides a rollback for every
        rank."""
        g = plan.config.guard
        # An outlier's update the step could not leave out is in the weights: only a rollback takes it out again.
        rollback_after = g.rollback_after if self.guard.can_skip else 1
        if spike is not None and spike.count and self.guard.mode == "rollback" and (
                spike.nonfinite or len(spike.window) >= rollback_after):
            decided = decided_on_rank_zero(lambda: rollback(plan, spike, step), "planning a rollback (its checkpoint)",
                                           self.topology)
            if decided is not None:
                return decided
            self.guard.forget(spike.window)
            skipped = (UpdatesSkippedEvent(spike.since, spike.count, step),) if self.guard.can_skip else ()
            return Response("no rollback target", spike, skipped, left_out=self.guard.can_skip)
        if spike is not None and spike.count and self.guard.mode == "rollback" and self.guard.can_skip:
            # Fewer than rollback_after: left out in the step, as `skip` leaves them, and still counted towards one.
            return Response("skip", spike, (UpdatesSkippedEvent(spike.since, spike.count, step),), left_out=True)
        if spike is not None and spike.count and self.guard.mode == "skip":
            skipped = UpdatesSkippedEvent(spike.since, spike.count, step)
            if len(spike.window) <= g.window // 2:
                return Response("skip", spike, (skipped,))
            # More than half the window's updates left out: leaving out every update would stall the run.
            return Response("give up", spike, (skipped, GaveUpEvent(spike.window, spike.nonfinite, (
                f"spike guard: the updates of {len(spike.window)} of the last {g.window} steps were left out (steps "
                f"{spike.window[0]}-{spike.window[-1]}): the loss has moved, not spiked; stopping without saving. "
                "Lower optimizer.lr or raise schedule.warmup_steps, or use train.spike_guard rollback"), step)))
        if spike is not None:
            return Response("go on", spike) if spike.count else GO_ON  # outliers watched, or none
        if not math.isfinite(checked.window_loss) and plan.config.train.precision != "fp16":
            # Guard off: fp16's overflows are its loss scaler's to skip; any other non-finite loss stops the run.
            raise checked.nonfinite_error(step, newest_complete(plan.config.layout.checkpoints))
        return GO_ON


def spike_rollbacks(ledger: Ledger, first: int, window: int) -> int:
    """The rollbacks of the spike whose first outlier is step `first`: the newest rollback counts when `first` comes
    within `window` steps of the range it left out, and each one before it likewise of the next."""
    count, reach = 0, first
    for event in reversed([e for e in ledger.events if isinstance(e, RollbackEvent)]):
        if reach > event.last + window:
            break
        count, reach = count + 1, event.first
    return count


def rollback(plan: RunPlan, spike: Spike, at_step: int) -> Response | None:
    """Where the rollback after `spike`, found after `at_step` steps, goes: the newest of this run's checkpoints before
    its first outlier, and the steps it leaves out, from its first outlier through its last with `guard.margin` more
    on each side (none before the checkpoint). A stop past `guard.max_rollbacks` for this spike; None when no
    checkpoint of this run precedes the outlier."""
    g, first, last = plan.config.guard, spike.first, spike.last
    span = f"steps {first}-{last}" if first != last else f"step {first}"
    by_hand = f"--skip-steps {max(first - g.margin, 1)}:{last + g.margin}"
    what = (f"{spike.nonfinite} non-finite loss or gradient norm" if spike.nonfinite else
            f"{len(spike.window)} outlier{'s' * (len(spike.window) != 1)} (loss or gradient norm above the last "
            f"{g.window} steps' mean + {g.threshold:g} deviations)")
    outliers = tuple(sorted({*spike.window, *spike.since}))
    if (done := spike_rollbacks(plan.ledger, first, g.window)) >= g.max_rollbacks:
        return Response("give up", spike, (GaveUpEvent(outliers, spike.nonfinite, (
            f"spike guard: {what} at {span}, after {done} rollbacks for this spike (guard.max_rollbacks "
            f"{g.max_rollbacks}, counted in {plan.ledger.path}); stopping without saving. Trace the batches "
            f"(roberta-trace {plan.config.train.output_dir} --step {first}), then lower optimizer.lr or raise "
            f"schedule.warmup_steps, skip them by hand ({by_hand}), or rerun with --set "
            f"guard.max_rollbacks={g.max_rollbacks + 1}"), at_step),))
    kept = [(folder, step) for folder in complete_checkpoints(plan.config.layout.checkpoints)
            if (step := read_record(folder).step) < first]
    if not kept:
        return None
    folder, step = kept[-1]
    event = RollbackEvent(max(step + 1, first - g.margin), min(last + g.margin, plan.end_step), outliers,
                          spike.nonfinite, folder.name, at_step)
    return Response("roll back", spike, (event,))
