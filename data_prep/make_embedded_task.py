"""Make the main job's fine-tuning task from the embedded corpus: which package a docstring comes from.

Kept so that `python data_prep/make_embedded_task.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.make.embedded_task` (`python -m pipeline.commands.make.embedded_task`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.make.embedded_task import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
