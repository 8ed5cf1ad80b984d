"""Export a pretraining checkpoint as an HF model folder (safetensors, config, tokenizer, model card), or a model
folder as ONNX.

    python launchers/export.py CHECKPOINT_OR_OUTPUT_DIR --out DIR [--overwrite]
    python launchers/export.py OUTPUT_DIR --out ROOT --all-checkpoints      (or --steps 1000,2000)
    python launchers/export.py --onnx FOLDER [--int8]                       (or --onnx FOLDER --verify)

CHECKPOINT_OR_OUTPUT_DIR is a `step_NNNNNNNN` checkpoint folder, or a training output folder
(its newest complete checkpoint is used). Any ZeRO stage and world size; the result loads with
`AutoModelForMaskedLM.from_pretrained(DIR)` and `transformers.pipeline("fill-mask", model=DIR)`.
Each export is checked: one validation batch through the training-time model and through the folder
loaded by transformers; beyond the precision's tolerance it is refused. With --all-checkpoints or
--steps, each kept checkpoint becomes `ROOT/step_NNNNNNNN/`, indexed in `ROOT/revisions.json`.

--onnx FOLDER writes the folder's ONNX file beside it (a Sentence-Transformers folder: `onnx/model.onnx`, hidden
states; a masked-LM export or classifier: `model.onnx`, logits), refused unless onnxruntime matches PyTorch within
fp32's tolerance on fixed inputs (pipeline/hub/onnx_export.py); --int8 adds dynamic int8 quantization beside it;
--verify repeats the check on the file already there.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pipeline.common.errors import exit_on_pipeline_error


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", nargs="?", help="checkpoint folder, or a training output folder")
    p.add_argument("--out", help="folder to write the HF model to")
    p.add_argument("--onnx", metavar="FOLDER", help="write FOLDER's ONNX file instead (a Sentence-Transformers, "
                   "masked-LM or classifier folder), checked against PyTorch")
    p.add_argument("--int8", action="store_true", help="with --onnx: also its int8 dynamic quantization")
    p.add_argument("--verify", action="store_true", help="with --onnx: check the ONNX file already there")
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
    parser = build_parser()
    args = parser.parse_args(argv)
    from pipeline.common.console import quiet_frameworks

    if args.onnx:
        if args.checkpoint or args.out or args.all_checkpoints or args.steps:
            parser.error("--onnx FOLDER takes no checkpoint, --out, --all-checkpoints or --steps")
        quiet_frameworks(args.verbose)
        export_onnx_file(args.onnx, int8=args.int8, verify=args.verify)
        return
    if args.int8 or args.verify:
        parser.error("--int8 and --verify go with --onnx FOLDER")
    if not args.checkpoint or not args.out:
        parser.error("give a checkpoint (or training output folder) and --out, or --onnx FOLDER")
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


def export_onnx_file(folder: str, *, int8: bool, verify: bool) -> None:
    from pipeline.hub.onnx_export import export_onnx, onnx_layout, verify_onnx

    if verify:
        agreement = verify_onnx(folder)
        print(f"{onnx_layout(folder).path}: matches PyTorch (largest difference {agreement.max_logit_difference:.3g}, "
              f"tolerance {agreement.tolerance:.3g}, {agreement.compared} positions)")
        return
    record = export_onnx(folder, int8=int8)
    parity = record["parity"]
    print(f"wrote {Path(folder) / record['file']} ({record['kind']}: input_ids, attention_mask → {record['output']}); "
          f"onnxruntime against PyTorch: largest difference {parity['max_logit_difference']:.3g} over "
          f"{parity['compared']} positions (tolerance {parity['tolerance']:.3g})")
    if "int8" in record:
        print(f"wrote {Path(folder) / record['int8']['file']} (int8 weights; largest difference from PyTorch "
              f"{record['int8']['max_difference_from_pytorch']:.3g}, not a refusal: measure the task metric with "
              "roberta-embed-eval --backend onnx-int8)")


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
