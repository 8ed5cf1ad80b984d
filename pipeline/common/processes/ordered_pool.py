"""A process pool that yields results in input order with a bounded number of items in flight."""

from __future__ import annotations

import multiprocessing as mp
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def ordered_map(
    fn: Callable, items: Iterable[tuple[int, tuple]], workers: int, initializer: Callable, initargs: tuple,
    window_per_worker: int = 4,
) -> Iterator[tuple[int, Any]]:
    """Apply `fn` to (key, args) items in worker processes; yield (key, result) in input order.

    At most `window_per_worker * workers` items are in flight, so memory does not grow with the
    input (`Pool.imap` reads its whole input eagerly). With one worker everything runs in-process.
    """
    if workers <= 1:
        initializer(*initargs)
        for key, fn_args in items:
            yield key, fn(*fn_args)
        return
    # spawn, not fork: the parent may already hold tokenizer or torch threads.
    with mp.get_context("spawn").Pool(workers, initializer, initargs) as pool:
        pending: deque = deque()
        for key, fn_args in items:
            pending.append((key, pool.apply_async(fn, fn_args)))
            if len(pending) >= window_per_worker * workers:
                key0, result = pending.popleft()
                yield key0, result.get()
        while pending:
            key0, result = pending.popleft()
            yield key0, result.get()
