"""Tokenize a corpus in parallel, pack it into fixed-length sequences and write zstd shards.

Kept so that `python data_prep/shard.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.shard` (`python -m pipeline.commands.shard`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.shard import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
