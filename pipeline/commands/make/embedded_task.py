"""Make the main job's fine-tuning tasks from the embedded corpus: which package a docstring comes from, or (with
--search) docstring search, each docstring's first sentence the query and the rest of it the document.

    python data_prep/make_embedded_task.py --corpus runs/default/corpus.jsonl --out runs/default/task
    python data_prep/make_embedded_task.py --corpus runs/default/corpus.jsonl --search --out runs/default/search
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.common.errors import exit_on_pipeline_error
from pipeline.data.makers.docstring_task import write_package_task, write_search_task


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True, help="the embedded corpus (.jsonl)")
    parser.add_argument("--out", type=Path, required=True, help="folder for train.jsonl and dev.jsonl")
    parser.add_argument("--classes", type=int, default=6, help="the N packages with the most docstrings")
    parser.add_argument("--search", action="store_true",
                        help="write search pairs (first sentence → the rest of the docstring) instead")
    return parser


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.search:
        info = write_search_task(args.corpus, args.out)
        print(f"wrote {args.out}: {info['train']} train / {info['dev']} dev search pairs (first sentence → the rest)")
        return
    info = write_package_task(args.corpus, args.out, args.classes)
    print(f"wrote {args.out}: {info['train']} train / {info['dev']} dev docstrings, labels {', '.join(info['labels'])}")


if __name__ == "__main__":
    main()
