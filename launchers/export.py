"""Export a pretraining checkpoint as an HF model folder (safetensors, config, tokenizer).

Kept so that `python launchers/export.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.export` (`python -m pipeline.commands.export`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.export import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
