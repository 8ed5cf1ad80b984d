"""When the pretraining loop logs, evaluates and saves, and the small timers beside each step.

`Cadence` answers, for the step just finished, "log, evaluate, save, stop?" from the config's
periods alone. The last step always logs; it neither evaluates nor saves here, because the
run's end does both once (`Pretrainer._finish`). `ThroughputWindow` measures tokens and samples
per second between two logs, and the share of the steps' time spent waiting for the loader.
`StepGuard` wraps a step in the rank watchdog (with several ranks), skipping the first step of a
process, which carries one-off costs (workers starting, compilation).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from pipeline.common.lost_rank import RankWatchdog, lost_rank_message
from pipeline.common.topology import Topology


@dataclass(frozen=True)
class Due:
    """What the loop does after one step."""

    log: bool
    evaluate: bool
    save: bool

    @property
    def any(self) -> bool:
        return self.log or self.evaluate or self.save


@dataclass(frozen=True)
class Cadence:
    """The loop's periods, in optimizer steps, and the step it ends at."""

    end_step: int
    log_every: int
    eval_every: int
    """0: evaluate only at the end."""
    save_every: int

    def due(self, step: int) -> Due:
        """After optimizer step `step` (1-based: the number of steps done)."""
        last = self.done(step)
        return Due(log=step % self.log_every == 0 or last,
                   evaluate=bool(self.eval_every) and step % self.eval_every == 0 and not last,
                   save=step % self.save_every == 0 and not last)

    def done(self, step: int) -> bool:
        return step >= self.end_step


class ThroughputWindow:
    """Tokens and samples trained since the last log, the seconds they took, and of the steps' own seconds those
    spent waiting for the next batch: a share near 0 means the loader keeps up, one that grows means the steps
    wait on it. The times are the host's: on a GPU a wait overlapped by queued kernels costs nothing."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.started, self.tokens, self.samples = time.perf_counter(), 0.0, 0
        self.stepping = self.waited = 0.0

    def add(self, *, samples: int = 0, tokens: float = 0.0, stepping: float = 0.0, waited: float = 0.0) -> None:
        """`stepping`: seconds inside steps; `waited`: the part of them spent waiting for the loader."""
        self.samples += samples
        self.tokens += tokens
        self.stepping += stepping
        self.waited += waited

    def rates(self) -> tuple[float, float, float]:
        """(tokens/s, samples/s, share of the steps' time spent waiting for data) over the window; starts the
        next one."""
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        rates = self.tokens / elapsed, self.samples / elapsed, self.waited / max(self.stepping, 1e-9)
        self.reset()
        return rates


class StepGuard:
    """With several ranks, a watchdog around each step after the process's first: a thread that ends this rank when
    a step outlasts `timeout_s`, its message saying where a rerun resumes (`resume_hint`)."""

    def __init__(self, first_step: int, topology: Topology, timeout_s: float, resume_hint: Callable[[], str]):
        self.first_step, self.watchdog = first_step, None
        if topology.world_size > 1:
            self.watchdog = RankWatchdog(timeout_s, lambda where: lost_rank_message(
                topology.rank, topology.world_size, where, timeout_s, resume_hint(),
                f"the step has waited {timeout_s:g} s"))

    def around(self, step: int) -> AbstractContextManager:
        """Guard optimizer step `step` (0-based, about to run)."""
        if self.watchdog is None or step <= self.first_step:
            return nullcontext()
        return self.watchdog.guard(f"at step {step + 1}")

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.close()
