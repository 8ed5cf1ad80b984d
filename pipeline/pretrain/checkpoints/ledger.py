"""The run's ledger: what an operator did to a run and what the run did about it, one event a line, in order.

`<output_dir>/ledger.jsonl` outlives every checkpoint: a checkpoint records only its own past, and a
rollback deletes or sets aside the checkpoints that knew of an earlier skip. So the ledger is what keeps
a skipped range skipped: every resume reads it (preflight.py), and the plan skips its ranges with the
config's and the start checkpoint's (run_plan.py). Events are only appended; the file is rewritten whole
through an atomic rename each time, so a kill leaves the old ledger or the new one, never half a line.

    {"event": "skip", "steps": "6501:6550", "at_step": 6000, "time": "…"}
        steps A to B (1-based, inclusive) are left out from now on; the run stood at `at_step`
    {"event": "set_aside", "folder": "rolled-back-step_00007000", "why": "rolled-back", "at_step": 6000, "time": "…"}
        a checkpoint moved aside (pretrain/checkpointer.py): it trained on a skipped range, or its files are damaged
    {"event": "updates_skipped", "steps": [6512, 6530], "count": 2, "at_step": 6600, "time": "…"}
        the spike guard left these steps' updates out (`train.spike_guard skip`, or `rollback` while no
        checkpoint lies behind the run; spike_response.py); `count` outliers since the last check, of which
        the window still named `steps`
    {"event": "rollback", "steps": "6001:6530", "outliers": [6512, 6530], "nonfinite": 0, "to": "step_00006000",
     "at_step": 6600, "time": "…"}
        the spike guard went back to checkpoint `to`; steps A to B are left out from now on, as a skip's are
    {"event": "gave_up", "outliers": [6512], "nonfinite": 0, "why": "…", "at_step": 6600, "time": "…"}
        the spike guard stopped the run: `why` says what a person should do
    {"event": "lock_taken_over", "holder": "pid 4242 on node07, SLURM job 991", "at_step": 6000, "time": "…"}
        the run folder's lock was held by a process that had died (a kill -9, a node lost): this run took it over

An event kind this release does not know (a newer release wrote it) is refused by name rather than
passed over, since it may be one that changes what the run trains on.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pipeline.common.atomic_files import write_text_atomic
from pipeline.common.errors import PipelineError

SetAsideWhy = Literal["rolled-back", "damaged"]


class LeftOutSteps:
    """An event that leaves steps `first` to `last` out (1-based, inclusive, as the logs number them)."""

    first: int
    last: int

    @property
    def steps(self) -> range:
        """The 0-based step indices left out, as the plan holds them."""
        return range(self.first - 1, self.last)


@dataclass(frozen=True)
class SkipEvent(LeftOutSteps):
    """Steps `first` to `last` are left out from now on."""

    first: int
    last: int
    at_step: int
    """The step the run resumed from when the skip was first planned."""
    time: str = ""

    def to_json(self) -> dict:
        return {"event": "skip", "steps": f"{self.first}:{self.last}", "at_step": self.at_step, "time": self.time}


@dataclass(frozen=True)
class SetAsideEvent:
    """A checkpoint renamed `<why>-step_…`: kept for a look (up to `checkpoint.keep_set_aside`), never resumed."""

    folder: str
    why: SetAsideWhy
    at_step: int
    time: str = ""

    def to_json(self) -> dict:
        return {"event": "set_aside", "folder": self.folder, "why": self.why, "at_step": self.at_step,
                "time": self.time}


@dataclass(frozen=True)
class UpdatesSkippedEvent:
    """The spike guard left out the updates of `steps` (1-based), `count` outliers since its last check."""

    steps: tuple[int, ...]
    count: int
    at_step: int
    time: str = ""

    def to_json(self) -> dict:
        return {"event": "updates_skipped", "steps": list(self.steps), "count": self.count, "at_step": self.at_step,
                "time": self.time}


@dataclass(frozen=True)
class RollbackEvent(LeftOutSteps):
    """The spike guard went back to checkpoint `to` after `outliers` (1-based steps, `nonfinite` of them with a
    non-finite loss or norm); steps `first` to `last` are left out from now on."""

    first: int
    last: int
    outliers: tuple[int, ...]
    nonfinite: int
    to: str
    at_step: int
    time: str = ""

    def to_json(self) -> dict:
        return {"event": "rollback", "steps": f"{self.first}:{self.last}", "outliers": list(self.outliers),
                "nonfinite": self.nonfinite, "to": self.to, "at_step": self.at_step, "time": self.time}


@dataclass(frozen=True)
class GaveUpEvent:
    """The spike guard stopped the run after `outliers`; `why` says what to do."""

    outliers: tuple[int, ...]
    nonfinite: int
    why: str
    at_step: int
    time: str = ""

    def to_json(self) -> dict:
        return {"event": "gave_up", "outliers": list(self.outliers), "nonfinite": self.nonfinite, "why": self.why,
                "at_step": self.at_step, "time": self.time}


@dataclass(frozen=True)
class LockTakenOverEvent:
    """The run folder's lock was held by `holder`, a process that had died; this run took it over at `at_step`."""

    holder: str
    at_step: int
    time: str = ""

    def to_json(self) -> dict:
        return {"event": "lock_taken_over", "holder": self.holder, "at_step": self.at_step, "time": self.time}


LedgerEvent = SkipEvent | SetAsideEvent | UpdatesSkippedEvent | RollbackEvent | GaveUpEvent | LockTakenOverEvent


@dataclass(frozen=True)
class Ledger:
    """A run's ledger as read: its events in the order they happened."""

    path: Path
    events: tuple[LedgerEvent, ...] = ()

    @property
    def skipped(self) -> tuple[range, ...]:
        """Every range a skip or a rollback left out (0-based step indices), in step order, each once."""
        return tuple(sorted({e.steps for e in self.events if isinstance(e, SkipEvent | RollbackEvent)},
                            key=lambda r: r.start))

    @property
    def rollbacks(self) -> int:
        """The spike guard's rollbacks in this run."""
        return sum(isinstance(e, RollbackEvent) for e in self.events)

    def with_events(self, events: list[LedgerEvent]) -> Ledger:
        """The ledger with `events` added at the end, in memory (what ranks other than 0 hold)."""
        now = datetime.now(UTC).isoformat(timespec="seconds")
        return Ledger(self.path, self.events + tuple(dataclasses.replace(e, time=e.time or now) for e in events))

    def append(self, events: list[LedgerEvent], *, write: bool = True) -> Ledger:
        """The ledger with `events` added at the end, written atomically (rank 0); without `write` only in memory
        (what the other ranks hold)."""
        if not events:
            return self
        ledger = self.with_events(events)
        if not write:
            return ledger
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, "".join(json.dumps(e.to_json()) + "\n" for e in ledger.events))
        return ledger


def read_ledger(path: Path) -> Ledger:
    """The ledger at `path` (none yet: an empty one); a damaged line or an unknown event is a PipelineError naming
    the file and the line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return Ledger(path)
    except (OSError, UnicodeDecodeError) as err:
        raise PipelineError(f"{path}: the run's ledger cannot be read ({err})") from None
    return Ledger(path, tuple(_event(path, n, line) for n, line in enumerate(lines, 1) if line.strip()))


def _event(path: Path, n: int, line: str) -> LedgerEvent:
    where = f"{path} line {n}"
    try:
        data = json.loads(line)
        kind = data["event"]
        if kind == "skip":
            first, last = (int(x) for x in str(data["steps"]).split(":"))
            if not 1 <= first <= last:
                raise ValueError(f"steps {data['steps']!r} is not a range A:B with 1 ≤ A ≤ B")
            return SkipEvent(first, last, int(data["at_step"]), str(data.get("time", "")))
        if kind == "set_aside":
            if data["why"] not in ("rolled-back", "damaged"):
                raise ValueError(f"why {data['why']!r} is neither 'rolled-back' nor 'damaged'")
            return SetAsideEvent(str(data["folder"]), data["why"], int(data["at_step"]), str(data.get("time", "")))
        if kind == "updates_skipped":
            return UpdatesSkippedEvent(tuple(int(s) for s in data["steps"]), int(data["count"]), int(data["at_step"]),
                                       str(data.get("time", "")))
        if kind == "rollback":
            first, last = (int(x) for x in str(data["steps"]).split(":"))
            if not 1 <= first <= last:
                raise ValueError(f"steps {data['steps']!r} is not a range A:B with 1 ≤ A ≤ B")
            return RollbackEvent(first, last, tuple(int(s) for s in data["outliers"]), int(data["nonfinite"]),
                                 str(data["to"]), int(data["at_step"]), str(data.get("time", "")))
        if kind == "lock_taken_over":
            return LockTakenOverEvent(str(data["holder"]), int(data["at_step"]), str(data.get("time", "")))
        if kind == "gave_up":
            return GaveUpEvent(tuple(int(s) for s in data["outliers"]), int(data["nonfinite"]), str(data["why"]),
                               int(data["at_step"]), str(data.get("time", "")))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
        raise PipelineError(f"{where}: the run's ledger is damaged ({type(err).__name__}: {err}); restore it from a "
                            "copy, or remove the line if you know what it held") from None
    raise PipelineError(f"{where}: event {kind!r} is not one this roberta-pipeline knows (a newer release wrote it?); "
                        "upgrade roberta-pipeline to resume this run")
