"""Export a pretraining checkpoint as an HF model folder (safetensors, config, tokenizer, model card).

    python launchers/export.py CHECKPOINT_OR_OUTPUT_DIR --out DIR [--overwrite]
    python launchers/export.py OUTPUT_DIR --out ROOT --all-checkpoints      (or --steps 1000,2000)

CHECKPOINT_OR_OUTPUT_DIR is a `step_NNNNNNNN` checkpoint folder, or a training output folder
(its newest complete checkpoint is used). Any ZeRO stage and world size; the result loads with
`AutoModelForMaskedLM.from_pretrained(DIR)` and `transformers.pipeline("fill-mask", model=DIR)`.
Each export is checked: one validation batch through the training-time model and through the folder
loaded by transformers; beyond the precision's tolerance it is refused. With --all-checkpoints or
--steps, each kept checkpoint becomes `ROOT/step_NNNNNNNN/`, indexed in `ROOT/revisions.json`.
"""

from __future__ import annotations

import argparse
import os

from pipeline.common.errors import exit_on_pipeline_error


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", help="checkpoint folder, or a training output folder")
    p.add_argument("--out", required=True, help="folder to write the HF model to")
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out (or revision)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--all-checkpoints", action="store_true",
                       help="export every kept checkpoint of the run as --out/step_NNNNNNNN, with revisions.json")
    which.add_argument("--steps", type=_steps, metavar="N,N,...",
                       help="export the checkpoints at these steps as --out/step_NNNNNNNN, with revisions.json")
    p.add_argument("--verbose", action="store_true",
                   help="show the frameworks' own logs, warnings and progress bars (default: warnings and up)")
    return p


@exit_on_pipeline_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    from pipeline.common.console import quiet_frameworks

    quiet_frameworks(args.verbose)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # consolidation needs no GPU
    from pipeline.pretrain.export.folder import export_checkpoint, export_revisions

    if not (args.all_checkpoints or args.steps):
        out = export_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite)
        print(f"exported {out}")
        return
    index = export_revisions(args.checkpoint, args.out, steps=args.steps, overwrite=args.overwrite)
    print(f"{'step':>10}  {'tokens seen':>14}  {'val loss':>8}  {'max |Δlogit|':>12}  folder")
    for entry in index:
        loss = "—" if entry["validation_loss"] is None else f"{entry['validation_loss']:.3f}"
        tokens = "—" if entry["tokens_seen"] is None else f"{entry['tokens_seen']:,}"
        print(f"{entry['step']:>10,}  {tokens:>14}  {loss:>8}  {entry['max_logit_difference']:>12.3g}  "
              f"{entry['folder']}")
    print(f"{len(index)} revisions under {args.out} (index: revisions.json)")


def _steps(text: str) -> list[int]:
    try:
        steps = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected steps as N,N,... (e.g. 1000,2000), got {text!r}") from None
    if not steps or min(steps) < 0:
        raise argparse.ArgumentTypeError(f"expected steps as N,N,... of non-negative integers, got {text!r}")
    return steps


if __name__ == "__main__":
    main()
