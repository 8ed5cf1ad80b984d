"""Make minimal pairs (agreement, determiners, word order) from the held-out documents of a corpus.

    python data_prep/make_minimal_pairs.py --input runs/default/corpus.jsonl --out pairs.jsonl \\
        [--per-phenomenon 200] [--held-out-fraction 0.05] [--seed 0]

The pairs are the format `launchers/minimal_pairs.py` reads; see pipeline/data/makers/minimal_pairs.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.common.errors import PipelineError, exit_on_pipeline_error
from pipeline.data.shards.options import DEFAULT_VAL_FRACTION


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", nargs="+", required=True, help="corpus files, folders or globs (.txt/.jsonl/.zst)")
    p.add_argument("--out", required=True, type=Path, help="the pairs, as JSON lines")
    p.add_argument("--per-phenomenon", type=int, default=200, help="pairs of each phenomenon, at most (200)")
    p.add_argument("--seed", type=int, default=0, help="which sentences and edit sites (0)")
    p.add_argument("--held-out-fraction", type=float, default=DEFAULT_VAL_FRACTION,
                   help=f"use the documents the shard stage's validation split holds at this fraction "
                        f"({DEFAULT_VAL_FRACTION}); 1 uses every document")
    p.add_argument("--text-field", default="text", help="the text field of .jsonl records (text)")
    return p


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> None:
    from pipeline.data.makers.minimal_pairs import PHENOMENA, held_out_texts, make_pairs, write_pairs

    args = build_parser().parse_args(argv)
    if not 0 < args.held_out_fraction <= 1:
        raise PipelineError(f"--held-out-fraction {args.held_out_fraction}: must be in (0, 1]")
    pairs = make_pairs(held_out_texts(args.input, args.held_out_fraction, args.text_field),
                       per_phenomenon=args.per_phenomenon, seed=args.seed)
    if not pairs:
        raise PipelineError(f"no minimal pair could be made from {' '.join(args.input)}: no prose sentence of "
                            "5 to 20 words in the held-out documents (try --held-out-fraction 1)")
    write_pairs(args.out, pairs)
    counts = {ph: sum(p["phenomenon"] == ph for p in pairs) for ph in PHENOMENA}
    print(f"{len(pairs)} pairs written to {args.out}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
