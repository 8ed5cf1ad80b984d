"""Train a tokenizer on a corpus: byte-level BPE (RoBERTa) or WordPiece (BERT).

    python data_prep/train_tokenizer.py --input corpus.jsonl --type bpe --vocab-size 50265 --out tokenizer/

The folder loads with `transformers.AutoTokenizer.from_pretrained(DIR)`. Inputs are read like
`data_prep/shard.py` reads them: .txt/.jsonl/.parquet (optionally .zst/.gz), folders, globs, hf:NAME.
The flags are generated from `pipeline.data.tokenizer_options.TokenizerOptions`.
"""

from __future__ import annotations

import argparse
from itertools import islice
from pathlib import Path

from pipeline.common.config.cli_options import add_options, options_from_namespace
from pipeline.common.errors import PipelineError, exit_on_pipeline_error
from pipeline.data.corpus import check_sources, iter_texts, resolve_inputs
from pipeline.data.tokenizer import train_tokenizer
from pipeline.data.tokenizer_options import TokenizerOptions


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(parser, TokenizerOptions)
    return parser


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    options = options_from_namespace(TokenizerOptions, parser.parse_args(argv), parser)
    if problems := options.problems():
        raise PipelineError("invalid arguments:\n  " + "\n  ".join(problems))
    out = Path(options.out)
    sources = resolve_inputs(list(options.inputs))
    check_sources(sources, options.corpus_options())
    if out.exists() and not out.is_dir():
        raise PipelineError(f"--out {out} exists and is not a folder")
    texts = iter_texts(sources, options.corpus_options())
    if options.max_documents is not None:
        texts = islice(texts, options.max_documents)
    tok = train_tokenizer(texts, options.type, options.effective_vocab_size, out,
                          min_frequency=options.min_frequency, lowercase=options.lowercase,
                          model_max_length=options.model_max_length)
    print(f"wrote {out}: {options.type} tokenizer, vocabulary {len(tok):,}")


if __name__ == "__main__":
    main()
