"""Make the main job's fine-tuning tasks from the embedded corpus: which package a docstring comes from, or (with
--search) docstring search, each docstring's first sentence the query and the rest of it the document, or (with
--documents) the corpus's documents split as the shard stage splits them (a corpus stage's train and dev).

    python data_prep/make_embedded_task.py --corpus runs/default/corpus.jsonl --out runs/default/task
    python data_prep/make_embedded_task.py --corpus runs/default/corpus.jsonl --search --out runs/default/search
    python data_prep/make_embedded_task.py --corpus runs/default/corpus.jsonl --documents --val-fraction 0.1 --out D
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.common.errors import exit_on_pipeline_error
from pipeline.data.makers.docstring_task import write_document_split, write_package_task, write_search_task


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True, help="the embedded corpus (.jsonl)")
    parser.add_argument("--out", type=Path, required=True, help="folder for train.jsonl and dev.jsonl")
    parser.add_argument("--classes", type=int, default=6, help="the N packages with the most docstrings")
    parser.add_argument("--search", action="store_true",
                        help="write search pairs (first sentence → the rest of the docstring) instead")
    parser.add_argument("--documents", action="store_true",
                        help="write the documents ({\"text\"}); dev: those shard.py holds out at --val-fraction")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="with --documents: shard.py's --val-fraction")
    return parser


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.documents:
        info = write_document_split(args.corpus, args.out, args.val_fraction)
        print(f"wrote {args.out}: {info['train']} train / {info['dev']} held-out documents")
        return
    if args.search:
        info = write_search_task(args.corpus, args.out)
        print(f"wrote {args.out}: {info['train']} train / {info['dev']} dev search pairs (first sentence → the rest)")
        return
    info = write_package_task(args.corpus, args.out, args.classes)
    print(f"wrote {args.out}: {info['train']} train / {info['dev']} dev docstrings, labels {', '.join(info['labels'])}")


if __name__ == "__main__":
    main()
