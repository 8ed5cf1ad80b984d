"""A quick look at a trained model from the shell: classify a text (or pair), tag words, answer, or fill a mask.

Kept so that `python launchers/predict.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.predict` (`python -m pipeline.commands.predict`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.predict import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
