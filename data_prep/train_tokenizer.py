"""Train a tokenizer on a corpus: byte-level BPE (RoBERTa) or WordPiece (BERT).

    python data_prep/train_tokenizer.py --input corpus.jsonl --type bpe --vocab-size 50265 --out tokenizer/

The folder loads with `transformers.AutoTokenizer.from_pretrained(DIR)`. Inputs are read like
`data_prep/shard.py` reads them: .txt/.jsonl/.parquet (optionally .zst/.gz), folders, globs, hf:NAME.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import _bootstrap  # noqa: F401

from pipeline.common.errors import PipelineError, exit_on_pipeline_error
from pipeline.data.corpus import CorpusOptions, check_sources, iter_texts, resolve_inputs
from pipeline.data.tokenizer import DEFAULT_VOCAB_SIZE, train_tokenizer


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True, help="files, folders, globs or hf:NAME")
    parser.add_argument("--type", choices=("bpe", "wordpiece"), default="bpe")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="vocabulary size including special tokens (default: 50265 for bpe, 30522 for wordpiece)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--min-frequency", type=int, default=2, help="minimum count of a merge or word piece")
    parser.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=None,
                        help="lowercase text (default: no for bpe, yes for wordpiece)")
    parser.add_argument("--text-field", default="text", help="text field of jsonl/parquet/hf records")
    parser.add_argument("--one-doc-per-line", action="store_true", help=".txt: one document per line")
    parser.add_argument("--max-documents", type=int, default=None, help="train on at most this many documents")
    parser.add_argument("--model-max-length", type=int, default=512)
    args = parser.parse_args(argv)

    vocab_size = args.vocab_size or DEFAULT_VOCAB_SIZE[args.type]
    options = CorpusOptions(text_field=args.text_field, one_doc_per_line=args.one_doc_per_line)
    sources = resolve_inputs(args.input)
    check_sources(sources, options)
    if args.out.exists() and not args.out.is_dir():
        raise PipelineError(f"--out {args.out} exists and is not a folder")
    texts = iter_texts(sources, options)
    if args.max_documents is not None:
        from itertools import islice

        texts = islice(texts, args.max_documents)
    tok = train_tokenizer(texts, args.type, vocab_size, args.out, min_frequency=args.min_frequency,
                          lowercase=args.lowercase, model_max_length=args.model_max_length)
    print(f"wrote {args.out}: {args.type} tokenizer, vocabulary {len(tok):,}")


if __name__ == "__main__":
    main()
