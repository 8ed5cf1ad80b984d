"""The checkpointer: where a run starts, what a start sets aside, when the run saves (checkpoints/storage.py keeps
them).

Where a run starts (`find_start`, a `Start`): its newest checkpoint whose record reads and that trained on no
skipped range (those after it are rolled back), else the anneal's source, else step 0; the start checked against
the config. The preflight asks it before any process group exists; the spike guard's rollback asks it again
(guard/spike_response.py).

Once the process group exists, the trainer's start opens the run (`open_run`): rank 0 holds the run folder
(common/folder_lock.py, the kernel's lock; a second run on a live run's folder is refused on every rank, naming the
holder, before anything is written), then makes sure of the plan's start, as every rollback's plan is made sure
of (`carry_out`), in named steps: the ledger's new events (a lock left by an ended holder, the plan's new skipped
ranges), the checkpoints they roll back set aside, the start's checksums checked (falling back past a damaged one), the
set-aside checkpoints beyond `checkpoint.keep_set_aside` deleted, the first set aside first. Every rank then takes
rank 0's plan, so the ranks never act on different sets of checkpoints (a shared file system may show them
different ones for a while), or rank 0's error, so that every rank stops at once naming it
(common/processes/rank_zero.py). The Checkpointer loads the start into the engine, saves every `checkpoint.every`
steps (the run's end saves once more itself), and notes events in the ledger. It reports through the run log it is
given, which it does not import.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from pipeline.common.errors import PipelineError
from pipeline.common.folder_lock import FolderLock
from pipeline.common.processes.rank_zero import decided_on_rank_zero
from pipeline.common.processes.topology import Topology
from pipeline.data.tokenizer import TokenizerInfo
from pipeline.pretrain.checkpoints.ledger import (
    Ledger,
    LedgerEvent,
    LockTakenOverEvent,
    SetAsideEvent,
    SkipEvent,
    read_ledger,
)
from pipeline.pretrain.checkpoints.record import StartPoint, read_record
from pipeline.pretrain.checkpoints.storage import (
    complete_checkpoints,
    load_into,
    newest_complete,
    prune_set_aside,
    resolve_checkpoint,
    save_checkpoint,
    set_aside_for_start,
    tag_for,
)
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.plan.run_plan import RunPlan, build_plan

REFUSAL_HINT = "wait for it to end, stop it (scancel for a SLURM job), or give this run another train.output_dir"


class Outcome(Protocol):
    """A spike guard's response, as the checkpointer carries it out (spike_response.py's `Response`)."""

    action: str
    events: tuple[LedgerEvent, ...]


class GuardWindow(Protocol):
    """What a checkpoint keeps of the spike guard (guard/spike_guard.py): its window."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any] | None, step: int) -> None: ...


class Reporter(Protocol):
    """What the checkpointer says (the run log's interface)."""

    def say(self, message: str) -> None: ...

    def report(self, step: int, event: dict[str, Any], message: str | None = None) -> None: ...


class Checkpointer:
    """Makes sure of, loads and saves this run's checkpoints on one rank."""

    def __init__(self, config: PretrainConfig, topology: Topology, reporter: Reporter):
        self.root, self.topology, self.reporter = config.layout.checkpoints, topology, reporter
        self.run_folder = config.layout.root
        self.lock: FolderLock | None = None
        self.allow_unlocked = config.train.allow_unlocked_folder
        self.every, self.keep_last = config.checkpoint.every, config.checkpoint.keep_last
        self.keep_set_aside = config.checkpoint.keep_set_aside
        self.plan: RunPlan | None = None
        self.verify_seconds = 0.0

    def open_run(self, plan: RunPlan) -> RunPlan:
        """The run's start, once: rank 0 holds the run folder for the whole run, or every rank stops (a live run
        holds it, named) before anything is written; then it makes sure of the plan's start (`_start_made_sure`),
        as a rollback's plan is made sure of (`carry_out`). A failure after the folder is held leaves it held: the
        caller releases it (`release`)."""
        return self._decided(lambda: plan, "opening the run (its folder, ledger and checkpoints)", hold=True)

    def _decided(self, planned: Callable[[], RunPlan], what: str, *, hold: bool) -> RunPlan:
        """Rank 0 holds the run folder (with `hold`), makes `planned()` and makes sure of its start, in one decision
        every rank takes; a refusal of the folder stops every rank."""
        started = time.perf_counter()
        outcome = decided_on_rank_zero(lambda: self._held(hold) or self._start_made_sure(planned(), opening=hold), what,
                                       self.topology)
        if isinstance(outcome, str):  # refused: rank 0 says why
            if self.topology.is_main:
                raise PipelineError(outcome)
            raise SystemExit(2)
        self.verify_seconds = time.perf_counter() - started
        self.plan = outcome
        return outcome

    def _held(self, hold: bool) -> str | None:
        """Rank 0, at the run's start (`hold`): the run folder held, or why not."""
        if not hold:
            return None
        try:
            self.lock = FolderLock(self.run_folder, allow_unlocked=self.allow_unlocked).acquire(REFUSAL_HINT)
        except PipelineError as err:
            return str(err)
        return None

    def release(self) -> None:
        """The run folder free again (rank 0, at the run's end or when it fails)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _start_made_sure(self, plan: RunPlan, *, opening: bool) -> RunPlan:
        """Rank 0: the ledger's new events first, then the set-asides they call for (a kill in between still rolls
        them back at the next start) and the start's checksums (falling back past a damaged start), then the old
        set-asides pruned."""
        events = self._start_events(plan.start_step, plan.unrecorded_skips, opening)
        ledger = plan.ledger.append(events)
        moved, found = set_aside_for_start(self.root, plan.rolled_back, plan.start, self._warn)
        ledger = ledger.append([SetAsideEvent(p.name, "damaged" if p.name.startswith("damaged-") else "rolled-back",
                                              plan.start_step) for p in moved])
        for folder in prune_set_aside(self.root, self.keep_set_aside):
            self._warn(f"deleted {folder.name}, set aside earlier (checkpoint.keep_set_aside {self.keep_set_aside} "
                       "keeps the last ones set aside)")
        plan = dataclasses.replace(plan, ledger=ledger)
        if plan.start is not None and found != plan.start.checkpoint:
            plan = plan.starting_from(StartPoint.at(found, read_record(found), plan.world_size) if found else None)
        return plan

    def _start_events(self, step: int, skips: tuple[range, ...], opening: bool) -> list[LedgerEvent]:
        """What this start at `step` found new: a lock its ended holder left (named when the run opens), the skipped
        ranges the ledger does not hold yet (`skips`)."""
        taken_over = self.lock.taken_over if opening and self.lock is not None else None
        notes: list[LedgerEvent] = [LockTakenOverEvent(taken_over.describe(), step)] if taken_over else []
        return notes + [SkipEvent(r.start + 1, r.stop, step) for r in skips]

    def load(self, engine, guard: GuardWindow) -> int:
        """Load the plan's start into the engine and its window into the spike `guard`, on every rank; returns its
        step (which sets the LR: `engine.restore_step`)."""
        start, started = self.plan.start, time.perf_counter()
        if start.universal:
            self.reporter.say(f"checkpoint {start.checkpoint.name} was written by {start.record.world_size} ranks, "
                              f"this run has {self.topology.world_size}: converting it to a universal checkpoint")
        if start.record.version < 2 and not start.anneal:
            self.reporter.say(f"checkpoint {start.checkpoint.name} was written by an earlier release, which kept no "
                              "record of its data order: the run goes on in this release's order")
        saved = load_into(engine, start, is_main=self.topology.is_main)
        # An anneal's source trained on other data: its window says nothing of this run's level.
        guard.load_state_dict(None if start.anneal else saved.get("spike_guard"), start.step)
        event = {"resumed_from": str(start.checkpoint), "resume_load_seconds": round(time.perf_counter() - started, 3),
                 "checkpoint_verify_seconds": round(self.verify_seconds, 3)}
        message = f"resumed from {start.checkpoint} (step {start.step})"
        if start.anneal:
            a, peak = self.plan.anneal, self.plan.config.optimizer.lr
            event["anneal_steps"] = a.steps
            lr_from, lr_to = (self.plan.schedule.multiplier(step) * peak for step in (a.start, a.start + a.steps))
            message = (f"annealing from {start.checkpoint} (step {a.start}) for {a.steps} steps: LR {lr_from:.3g} "
                       f"to {lr_to:.3g} ({self.plan.config.schedule.decay})")
        self.reporter.report(start.step, event, message)
        return start.step

    def due(self, step: int) -> bool:
        """Whether the run saves after `step` steps (the run's last step is saved by its end)."""
        return step % self.every == 0 and step < self.plan.end_step

    def after_step(self, engine, step: int, guard: GuardWindow) -> None:
        if self.due(step):
            self.save(engine, step, guard)

    def save(self, engine, step: int, guard: GuardWindow) -> None:
        """A checkpoint after `step` steps, with the plan's record of them and the spike `guard`'s window; none when
        the newest complete checkpoint is this step's already (a rerun of a finished run)."""
        if (newest := self.newest_complete()) is not None and newest.name == tag_for(step):
            return
        started = time.perf_counter()
        # The model's own shape: with model.init_from it is the folder's, not the config's.
        record = self.plan.record(step, hf_config=json.loads(engine.module.config.to_json_string()))
        state = guard.state_dict()
        folder = save_checkpoint(engine, self.root, record, self.keep_last, {"spike_guard": state} if state else {})
        self.reporter.report(step, {"checkpoint": str(folder),
                                    "checkpoint_seconds": round(time.perf_counter() - started, 3)})

    def carry_out(self, plan: RunPlan, response: Outcome, info: TokenizerInfo) -> Outcome:
        """The checkpoints' part in the spike guard's response (spike_response.py): its events noted in the ledger;
        a rollback's plan made from the checkpoint it names and its start made sure of (later ones set aside), in one
        decision of rank 0's that every rank takes."""
        ledger = self.note(plan.ledger, response.events)
        if response.action != "roll back":
            return response
        again = self._decided(lambda: plan_after_rollback(plan, ledger, info),
                              "planning a rollback (the run from its checkpoint)", hold=False)
        return dataclasses.replace(response, plan=again, rollbacks=ledger.rollbacks)

    def newest_complete(self) -> Path | None:
        return newest_complete(self.root)

    def note(self, ledger: Ledger, events: Sequence[LedgerEvent]) -> Ledger:
        """`ledger` with `events` added: rank 0 appends them to the run's ledger, read afresh (this session's start
        may have added to it since the preflight read it); the other ranks hold them in memory."""
        is_main = self.topology.is_main
        return (read_ledger(ledger.path) if is_main else ledger).append(list(events), write=is_main)

    def resume_hint(self) -> str:
        """Where a rerun of the same command resumes (the newest complete checkpoint), in words."""
        newest = self.newest_complete()
        if newest is None and self.plan.anneal is not None:
            return (f"No checkpoint of this run is complete yet: a rerun anneals from "
                    f"{self.plan.anneal_from.checkpoint} again.")
        if newest is None:
            return "No checkpoint is complete yet: a rerun starts from step 0."
        return (f"Rerun the same command to resume from the last complete checkpoint, {newest} "
                f"(step {read_record(newest).step}).")

    def _warn(self, message: str) -> None:
        print(f"warning: {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Start:
    """Where a run starts, as `find_start` finds it."""

    point: StartPoint | None
    """The checkpoint the run starts from (its own, or the anneal's source); None: step 0."""
    rolled_back: tuple[Path, ...]
    """The run's own checkpoints after it, which trained on a skipped range: the start sets them aside."""
    anneal_from: StartPoint | None
    """`train.anneal_from`'s checkpoint, which fixes the decay in every session of an anneal."""
    problems: list[str]
    """The checkpoints' problems against the config and the tokenizer; a run with any does not start."""


def find_start(config: PretrainConfig, tokenizer: TokenizerInfo | None, world_size: int,
               ledger_skips: tuple[range, ...] = ()) -> Start:
    """Where the run starts: its newest checkpoint whose record reads and that trained on no range the config or
    the run's ledger skips (those after it are rolled back), else `train.anneal_from`'s, else step 0. Also the
    anneal's source (it fixes the decay in every session), and the problems of the checkpoints against `config`
    and the tokenizer (None: it did not load, a problem reported on its own). A skip that rolls back every kept
    checkpoint is one of them, unless `train.restart_from_scratch` allows the restart."""
    anneal_from, checkpoint, problems = None, None, []
    if config.train.anneal_from:
        try:
            checkpoint = resolve_checkpoint(config.train.anneal_from)
        except PipelineError as err:
            problems.append(f"train.anneal_from: {err}")
    kept = complete_checkpoints(config.layout.checkpoints) if config.checkpoint.resume == "auto" else []
    if checkpoint is not None:
        try:
            anneal_from = StartPoint.at(checkpoint, read_record(checkpoint), world_size, anneal=True)
        except PipelineError as err:
            problems.append(f"train.anneal_from: {err}")
        if anneal_from and checkpoint.resolve().is_relative_to(config.layout.checkpoints.resolve()):
            problems.append(f"train.anneal_from {checkpoint} is inside this run's own train.output_dir; the anneal "
                            "writes into its own folder: give it another train.output_dir")
    rolled_back, own, untrained = [], None, []
    skips = sorted(set(config.train.skipped()) | set(ledger_skips), key=lambda r: r.start)
    if kept:
        for folder in reversed(kept):
            try:
                record = read_record(folder)
            except PipelineError:
                continue  # a damaged record: the checkpointer sets it aside
            # Not one that trained on a range the config or the ledger skips.
            untrained = [r for r in skips if r.start < record.step and (r.start + 1, r.stop) not in record.skipped]
            if not untrained:
                own = StartPoint.at(folder, record, world_size)
                break
            rolled_back.append((folder, record.step))
    if rolled_back and own is None and not config.train.restart_from_scratch:
        problems.append(rollback_problem(config, untrained, rolled_back, anneal_from))
    start = own or anneal_from
    if start is not None:
        problems += start.problems(config, tokenizer)
    return Start(start, tuple(folder for folder, _ in rolled_back), anneal_from, problems)


def rollback_problem(config: PretrainConfig, untrained: list[range], rolled_back: list[tuple[Path, int]],
                     anneal_from: StartPoint | None) -> str:
    """Why a skip that would roll back every kept checkpoint is refused: the checkpoint it needs, those kept, the
    choices. `untrained`: the ranges the oldest kept checkpoint trained on; `rolled_back`: (folder, step), newest
    first."""
    first = min(untrained, key=lambda r: r.start)
    ranges = ", ".join(f"{r.start + 1}:{r.stop}" for r in untrained)
    every = config.checkpoint.every
    needed = first.start // every * every  # the cadence's newest save at or before step A - 1
    need = (f"a checkpoint from step {first.start} or earlier (the newest the cadence saved: "
            f"{tag_for(needed)}, checkpoint.every {every})" if needed else
            f"a checkpoint from step {first.start} or earlier, and none is ever saved that early (checkpoint.every "
            f"{every})")
    kept = ", ".join(f"{folder.name}" for folder, _ in reversed(rolled_back))
    restart = (f"the anneal's source (train.anneal_from, step {anneal_from.step})" if anneal_from
               else "step 0")
    return (f"train.skip_steps {ranges}: a rollback to before step {first.start + 1} needs {need}; the kept "
            f"checkpoints ({kept}, checkpoint.keep_last {config.checkpoint.keep_last}) all trained on those steps. "
            f"Refused, so that the run does not start again from {restart} and set every checkpoint aside: pass "
            f"--restart-from-scratch (train.restart_from_scratch true) if that is what you want, or leave the range "
            f"out to go on from {rolled_back[0][0].name}; a larger checkpoint.keep_last keeps a checkpoint before "
            f"the next spike")


def plan_after_rollback(plan: RunPlan, ledger: Ledger, info: TokenizerInfo) -> RunPlan:
    """The run planned again with `ledger`'s skips (a rollback's among them): its start is the newest checkpoint that
    trained on none of them, the later ones are rolled back, as at a resume with `--skip-steps`."""
    config = plan.config
    start = find_start(config, info, plan.world_size, ledger.skipped)
    if start.problems or start.point is None:
        raise PipelineError(f"spike guard: the rollback cannot start ({'; '.join(start.problems) or 'no checkpoint'})")
    return build_plan(config, plan.world_size, plan.layouts, start.point, start.rolled_back, start.anneal_from, ledger)
