"""Write the embedded default corpus (Python's own documentation and docstrings) as JSON lines.

Kept so that `python data_prep/make_default_corpus.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.make.default_corpus` (`python -m pipeline.commands.make.default_corpus`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.make.default_corpus import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
