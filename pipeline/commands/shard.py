"""Tokenize a corpus in parallel, pack it into fixed-length sequences and write zstd shards.

    python data_prep/shard.py --input corpus.jsonl.zst --tokenizer tokenizer/ --seq-len 512 --out shards/

Writes `train/` and `val/` shards and, last, `index.json`. Rerunning with the same arguments
resumes (verified shards are kept); different arguments into a used folder are refused unless
--overwrite. With --rank/--world-size each process writes one part, and the last to finish
writes the index (or run --combine afterwards). Without --val-fraction, 5% of the documents are
held out for validation, as HF run_mlm does.

The flags are generated from `pipeline.data.shards.options.ShardOptions`, where each is defined once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.common.config.cli_options import add_options, options_from_namespace
from pipeline.common.errors import PipelineError, exit_on_pipeline_error
from pipeline.data.shards.index import combine_parts
from pipeline.data.shards.options import ShardOptions
from pipeline.data.shards.stage import run_hash_pass, run_shard_stage
from pipeline.data.shards.stage_report import format_summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(parser, ShardOptions)
    # A mode of this script, not an option of the stage: it only needs --out and --world-size.
    parser.add_argument("--combine", action="store_true", help="only combine finished parts into index.json")
    parser.add_argument("--dedup-hashes-only", action="store_true",
                        help="with --dedup exact: only hash this rank's records (the first pass of an array job)")
    return parser


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.combine:
        if a.out is None:
            parser.error("the following arguments are required: --out")
        index = combine_parts(Path(a.out), a.world_size)
        if index is None:
            raise PipelineError(f"{a.out}: not every one of the {a.world_size} parts is complete yet")
        print(format_summary(index))
        return
    options = options_from_namespace(ShardOptions, a, parser)
    if a.dedup_hashes_only:
        print(f"wrote {run_hash_pass(options)}", file=sys.stderr)
        return
    result = run_shard_stage(options)
    if not options.quiet:
        part = f"part {options.rank} of {options.world_size}"
        where = Path(options.out) / "index.json" if "splits" in result else part
        print(f"wrote {where}", file=sys.stderr)
        print(format_summary(result))
        examples = result.get("examples") or [e for part in result.get("parts", []) for e in part["examples"]]
        for example in examples:
            print(f"  skipped: {example}")


if __name__ == "__main__":
    main()
