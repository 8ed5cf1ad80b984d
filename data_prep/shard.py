"""Tokenize a corpus in parallel, pack it into fixed-length sequences and write zstd shards.

    python data_prep/shard.py --input corpus.jsonl.zst --tokenizer tokenizer/ --seq-len 512 --out shards/

Writes `train/` and `val/` shards and, last, `index.json`. Rerunning with the same arguments
resumes (verified shards are kept); different arguments into a used folder are refused unless
--overwrite. With --rank/--world-size each process writes one part, and the last to finish
writes the index (or run --combine afterwards).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import _bootstrap  # noqa: F401

from pipeline.common.errors import PipelineError, exit_on_pipeline_error
from pipeline.data.shard_index import combine_parts
from pipeline.data.shard_stage import ShardArgs, format_summary, run_shard_stage


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", help="files (.txt/.jsonl/.parquet, optionally .zst/.gz), folders, globs, "
                                               "or hf:NAME for a datasets dataset read in streaming mode")
    p.add_argument("--tokenizer", help="tokenizer folder, or a hub name such as roberta-base")
    p.add_argument("--seq-len", type=int, help="tokens per sequence, framing included")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--pack", choices=("full", "doc", "doc-packed", "pairs"), default="full",
                   help="full: RoBERTa FULL-SENTENCES (default); doc: DOC-SENTENCES (padded); doc-packed: whole "
                        "documents packed into rows, attention kept inside each; pairs: BERT segment pairs + NSP")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizer processes (default: cores)")
    p.add_argument("--val-fraction", type=float, default=0.0, help="fraction of documents held out for validation")
    p.add_argument("--shard-size", type=int, default=8192, help="sequences per shard file")
    p.add_argument("--text-field", default="text", help="text field of jsonl/parquet/hf records")
    p.add_argument("--one-doc-per-line", action="store_true",
                   help=".txt: each line is a document (default: documents are separated by blank lines)")
    p.add_argument("--max-doc-bytes", type=int, default=10_000_000,
                   help="skip (and count) documents larger than this")
    p.add_argument("--hf-config", default=None, help="configuration name for hf: inputs")
    p.add_argument("--hf-split", default="train", help="split for hf: inputs")
    p.add_argument("--rank", type=int, default=0, help="this process's part of the input")
    p.add_argument("--world-size", type=int, default=1, help="number of independent processes")
    p.add_argument("--seed", type=int, default=0, help="seed for pairs mode")
    p.add_argument("--compression-level", type=int, default=3, help="zstd level")
    p.add_argument("--overwrite", action="store_true", help="replace shards made with other arguments")
    p.add_argument("--strict", action="store_true", help="stop at the first bad record instead of counting it")
    p.add_argument("--combine", action="store_true", help="only combine finished parts into index.json")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    return p


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.combine:
        index = combine_parts(a.out, a.world_size)
        if index is None:
            raise PipelineError(f"{a.out}: not every one of the {a.world_size} parts is complete yet")
        print(format_summary(index))
        return
    missing = [flag for flag, value in (("--input", a.input), ("--tokenizer", a.tokenizer), ("--seq-len", a.seq_len))
               if value is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    args = ShardArgs(
        inputs=tuple(a.input), tokenizer=a.tokenizer, seq_len=a.seq_len, out=str(a.out), pack=a.pack,
        workers=a.workers, val_fraction=a.val_fraction, shard_size=a.shard_size, text_field=a.text_field,
        one_doc_per_line=a.one_doc_per_line, max_doc_bytes=a.max_doc_bytes, hf_config=a.hf_config,
        hf_split=a.hf_split, rank=a.rank, world_size=a.world_size, overwrite=a.overwrite, strict=a.strict,
        seed=a.seed, compression_level=a.compression_level, progress=not a.quiet,
    )
    result = run_shard_stage(args)
    if not a.quiet:
        where = a.out / "index.json" if "splits" in result else f"part {a.rank} of {a.world_size}"
        print(f"wrote {where}", file=sys.stderr)
        print(format_summary(result))
        examples = result.get("examples") or [e for part in result.get("parts", []) for e in part["examples"]]
        for example in examples:
            print(f"  skipped: {example}")


if __name__ == "__main__":
    main()
