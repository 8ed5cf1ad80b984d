"""Make SentEval's bigram-shift task from held-out corpus text (a thin shim: see
pipeline/commands/make/bigram_shift_task.py).

    python data_prep/make_bigram_shift_task.py --corpus runs/default/corpus.jsonl --out runs/default/bigram-shift
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.make.bigram_shift_task import build_parser, main  # noqa: F401  (build_parser: tests/docs)

if __name__ == "__main__":
    main()
