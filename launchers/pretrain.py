"""Pretrain an encoder with DeepSpeed from the shards made by data_prep/shard.py.

Kept so that `python launchers/pretrain.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.pretrain` (`python -m pipeline.commands.pretrain`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.pretrain import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
