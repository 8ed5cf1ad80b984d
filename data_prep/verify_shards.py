"""Check a shard folder: index, every checksum and count, and no unlisted shard file.

Kept so that `python data_prep/verify_shards.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.verify_shards` (`python -m pipeline.commands.verify_shards`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.verify_shards import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
