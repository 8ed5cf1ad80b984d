"""Write the embedded default corpus (Python's own documentation and docstrings) as JSON lines.

    python data_prep/make_default_corpus.py --out runs/default/corpus.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.common.errors import exit_on_pipeline_error
from pipeline.data.makers.default_corpus import write_embedded_corpus


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output .jsonl file")
    parser.add_argument("--max-bytes", type=int, default=None, help="stop after about this many bytes")
    return parser


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    counts = write_embedded_corpus(args.out, args.max_bytes)
    print(f"wrote {args.out}: {counts['documents']:,} documents ({counts['topic']} documentation topics, "
          f"{counts['docstring']:,} docstrings), {counts['bytes'] / 1e6:.1f} MB, Python {counts['python']}")


if __name__ == "__main__":
    main()
