"""Minimal-pair accuracy of a masked-LM, with a unigram baseline: see pipeline/commands/minimal_pairs.py."""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.minimal_pairs import main

if __name__ == "__main__":
    main()
