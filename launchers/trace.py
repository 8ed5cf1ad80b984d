"""Which documents fed a training step: each sequence of its global batch, with its corpus, file and lines.

Kept so that `python launchers/trace.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.trace` (`python -m pipeline.commands.trace`) (its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.trace import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
