"""Check a shard folder: index, every checksum and count, and no unlisted shard file.

    python data_prep/verify_shards.py DIR

Exits 0 when everything verifies, 1 naming each bad file otherwise.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.data.shards.index import verify_folder


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="output folder of data_prep/shard.py")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problems = verify_folder(args.folder)
    for problem in problems:
        print(f"BAD {problem}", file=sys.stderr)
    if problems:
        print(f"{args.folder}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"{args.folder}: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
