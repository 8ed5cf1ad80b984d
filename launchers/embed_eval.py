"""Score a model as an embedding model (search, STS, pair classification, clustering), or a run's revisions.

Kept so that `python launchers/embed_eval.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.embed_eval` (`roberta-embed-eval`, `python -m pipeline.commands.embed_eval`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.embed_eval import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
