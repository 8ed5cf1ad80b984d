"""Export a pretraining checkpoint as an HF model folder (safetensors, config, tokenizer).

    python launchers/export.py CHECKPOINT_OR_OUTPUT_DIR --out DIR [--overwrite]

CHECKPOINT_OR_OUTPUT_DIR is a `step_NNNNNNNN` checkpoint folder, or a training output folder
(its newest complete checkpoint is used). Any ZeRO stage and world size; the result loads with
`AutoModelForMaskedLM.from_pretrained(DIR)` and `transformers.pipeline("fill-mask", model=DIR)`.
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
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")
    p.add_argument("--verbose", action="store_true",
                   help="show the frameworks' own logs, warnings and progress bars (default: warnings and up)")
    return p


@exit_on_pipeline_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    from pipeline.common.console import quiet_frameworks

    quiet_frameworks(args.verbose)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # consolidation needs no GPU
    from pipeline.pretrain.export import export_checkpoint

    out = export_checkpoint(args.checkpoint, args.out, overwrite=args.overwrite)
    print(f"exported {out}")


if __name__ == "__main__":
    main()
