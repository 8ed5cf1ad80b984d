"""Compare MLflow runs side by side: differing params, final metrics, GLUE scores joined to pretraining runs.

Kept so that `python launchers/compare.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.compare` (`python -m pipeline.commands.compare`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.compare import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
