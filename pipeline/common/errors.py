"""The one exception type that carries a user-facing message.

Every check on user input raises `PipelineError` with a message naming the file, line or key and
what was expected; the command-line scripts print it without a traceback and exit with status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class PipelineError(Exception):
    """A problem with the user's input or environment, explained in the message."""


def exit_on_pipeline_error(main: Callable[P, R]) -> Callable[P, R]:
    """Decorate a CLI `main` so that a `PipelineError` prints `error: ...` and exits 2."""

    @wraps(main)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return main(*args, **kwargs)
        except PipelineError as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper
