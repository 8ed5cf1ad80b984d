"""The run's ledger: what an operator did to a run and what the run did about it, one event a line, in order.

`<output_dir>/ledger.jsonl` outlives every checkpoint: a checkpoint records only its own past, and a
rollback deletes or sets aside the checkpoints that knew of an earlier skip. So the ledger is what keeps
a skipped range skipped: every resume reads it (preflight.py), and the plan skips its ranges with the
config's and the start checkpoint's (plan.py). Events are only appended; the file is rewritten whole
through an atomic rename each time, so a kill leaves the old ledger or the new one, never half a line.

    {"event": "skip", "steps": "6501:6550", "at_step": 6000, "time": "…"}
        steps A to B (1-based, inclusive) are left out from now on; the run stood at `at_step`
    {"event": "set_aside", "folder": "rolled-back-step_00007000", "why": "rolled-back", "at_step": 6000, "time": "…"}
        a checkpoint moved aside (checkpoints.py): it trained on a skipped range, or its files are damaged

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


@dataclass(frozen=True)
class SkipEvent:
    """Steps `first` to `last` (1-based, inclusive, as the logs number them) are left out from now on."""

    first: int
    last: int
    at_step: int
    """The step the run resumed from when the skip was first planned."""
    time: str = ""

    @property
    def steps(self) -> range:
        """The 0-based step indices skipped, as the plan holds them."""
        return range(self.first - 1, self.last)

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


LedgerEvent = SkipEvent | SetAsideEvent


@dataclass(frozen=True)
class Ledger:
    """A run's ledger as read: its events in the order they happened."""

    path: Path
    events: tuple[LedgerEvent, ...] = ()

    @property
    def skipped(self) -> tuple[range, ...]:
        """Every range a skip event left out (0-based step indices), in step order, each once."""
        return tuple(sorted({e.steps for e in self.events if isinstance(e, SkipEvent)}, key=lambda r: r.start))

    def append(self, events: list[LedgerEvent]) -> Ledger:
        """The ledger with `events` added at the end, written atomically (rank 0 only)."""
        if not events:
            return self
        now = datetime.now(UTC).isoformat(timespec="seconds")
        stamped = tuple(dataclasses.replace(e, time=e.time or now) for e in events)
        ledger = Ledger(self.path, self.events + stamped)
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
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
        raise PipelineError(f"{where}: the run's ledger is damaged ({type(err).__name__}: {err}); restore it from a "
                            "copy, or remove the line if you know what it held") from None
    raise PipelineError(f"{where}: event {kind!r} is not one this roberta-pipeline knows (a newer release wrote it?); "
                        "upgrade roberta-pipeline to resume this run")
