"""Cloze check of a masked-LM model on held-out text: top-1 fill-mask accuracy and a few fill-mask examples.

Kept so that `python launchers/cloze.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.cloze` (`python -m pipeline.commands.cloze`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.cloze import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
