"""RoBERTa's design studies in one command: pretrain each arm at one token budget, fine-tune, tabulate.

Kept so that `python launchers/ablate.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.ablate` (`python -m pipeline.commands.ablate`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.ablate import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
