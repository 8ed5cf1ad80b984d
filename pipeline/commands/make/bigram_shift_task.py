"""Make SentEval's bigram-shift task from held-out corpus text: is a pair of adjacent words swapped?

    python data_prep/make_bigram_shift_task.py --corpus runs/default/corpus.jsonl --out runs/default/bigram-shift

Dev sentences come from the documents the shard stage holds out for validation (`--val-fraction`,
the shard stage's own rule; 0 takes every document); train sentences too, or with `--train-from
training` from the documents pretraining reads (a small corpus holds out too few for both). Half of
each split has one pair of adjacent words swapped (label 1), half is as written (label 0); the same
seed gives the same files. The files are a custom task (`{"text", "label"}` JSONL) for
`launchers/finetune.py` with configs/glue/custom.json. See pipeline/data/makers/bigram_shift.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.common.errors import exit_on_pipeline_error


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", type=Path, required=True, help="JSONL records with `text`, or one document a line")
    p.add_argument("--out", type=Path, required=True, help="folder for train.jsonl and dev.jsonl")
    p.add_argument("--val-fraction", type=float, default=0.05,
                   help="the shard stage's --val-fraction: only its validation documents are used (0: all)")
    p.add_argument("--dev-fraction", type=float, default=0.25, help="share of the sentences in dev (0.25)")
    p.add_argument("--max-examples", type=int, default=None,
                   help="read at most this many held-out sentences (and as many training ones)")
    p.add_argument("--train-from", choices=("held-out", "training"), default="held-out",
                   help="held-out: train and dev share the held-out sentences, split by hash (default); training: "
                        "dev is every held-out sentence, train the sentences of the documents pretraining reads")
    p.add_argument("--max-train", type=int, default=None, help="at most this many train sentences")
    p.add_argument("--seed", type=int, default=1, help="which sentences are swapped, and where")
    return p


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from pipeline.data.makers.bigram_shift import write_bigram_shift_task

    counts = write_bigram_shift_task(args.corpus, args.out, seed=args.seed, val_fraction=args.val_fraction,
                                     dev_fraction=args.dev_fraction, max_examples=args.max_examples,
                                     train_from=args.train_from, max_train=args.max_train)
    print(f"wrote {args.out}: {counts['train']} train / {counts['dev']} dev sentences, half with two adjacent "
          "words swapped (label 1)")


if __name__ == "__main__":
    main()
