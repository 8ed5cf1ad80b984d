"""The main job on the embedded default corpus: every stage of the pipeline, end to end.

Kept so that `python launchers/run_default.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.run_default` (`python -m pipeline.commands.run_default`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.run_default import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
