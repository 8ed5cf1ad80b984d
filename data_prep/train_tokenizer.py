"""Train a tokenizer on a corpus: byte-level BPE (RoBERTa) or WordPiece (BERT).

Kept so that `python data_prep/train_tokenizer.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.train_tokenizer` (`python -m pipeline.commands.train_tokenizer`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.train_tokenizer import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
