"""Shared settings and bookkeeping for the generated hostile-input tests (hypothesis).

Every generated case calls `count(category)`. At the end of the session the counts are printed
(visible with `-s`) and written to `<pytest base temp>/generated-cases.json`, so a report's numbers
come from a test run rather than from the settings.
"""

from __future__ import annotations

import json
import tracemalloc
from collections import Counter
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, settings

CASES = 300
"""Generated cases per test (hypothesis' max_examples): several hundred, seeded (derandomized)."""

COUNTS: Counter[str] = Counter()

GENERATED = settings(
    max_examples=CASES,
    deadline=timedelta(seconds=5),  # a hang is a failure, not a slow test
    derandomize=True,  # the same cases on every run and machine
    database=None,  # nothing written into the checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
    print_blob=True,
)


def count(category: str) -> None:
    COUNTS[category] += 1


def write_counts(base: Path) -> Path | None:
    if not COUNTS:
        return None
    path = base / "generated-cases.json"
    merged = Counter(json.loads(path.read_text())) if path.exists() else Counter()
    merged.update(COUNTS)
    path.write_text(json.dumps(dict(sorted(merged.items())), indent=2))
    print(f"\ngenerated bad inputs per category (this run): {json.dumps(dict(sorted(COUNTS.items())))}")
    COUNTS.clear()
    return path


@contextmanager
def peak_allocation():
    """Track Python and NumPy allocations in the block; yields a dict whose "peak" is set on exit (bytes)."""
    result = {"peak": 0}
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield result
    finally:
        result["peak"] = tracemalloc.get_traced_memory()[1] - base
        if started:
            tracemalloc.stop()
