"""Make minimal pairs from the held-out documents of a corpus (a thin shim: see
pipeline/commands/make/minimal_pairs.py).

    python data_prep/make_minimal_pairs.py --input runs/default/corpus.jsonl --out pairs.jsonl
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.make.minimal_pairs import build_parser, main  # noqa: F401  (build_parser: tests/docs)

if __name__ == "__main__":
    main()
