"""SIGTERM / SIGUSR1 → finish the current step, checkpoint, exit 0 (preemption and time limits)."""

from __future__ import annotations

import signal
import time


class StopRequest:
    """Records the first stop signal; the loop polls `requested` between optimizer steps."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.signal_name: str | None = None
        self.received_at: float | None = None
        self._previous = {}

    def install(self) -> StopRequest:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            self.received_at = time.monotonic()

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
