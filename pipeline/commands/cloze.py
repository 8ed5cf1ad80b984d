"""Cloze check of a masked-LM model on held-out text: top-1 fill-mask accuracy and a few fill-mask examples.

    python launchers/cloze.py --model runs/default/pretrain/export --shards runs/default/shards [--json OUT]

The texts are the validation split of `--shards` (text the model did not train on), decoded. A
share `--mask-rate` of each text's tokens is blanked with `<mask>` (seeded: the same blanks on
every run) and scored in one forward per text; `--examples` lines get one word blanked and the
model's top 3 fillings, through `Encoder.fill_mask`. See pipeline/hub/cloze.py.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pipeline.common.errors import exit_on_pipeline_error


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="an export, pretraining output folder, checkpoint or hub name")
    p.add_argument("--shards", required=True, type=Path, help="a shard folder: its validation split is the text")
    p.add_argument("--mask-rate", type=float, default=0.15, help="share of each text's tokens blanked (0.15)")
    p.add_argument("--max-texts", type=int, default=256, help="validation texts scored (default 256)")
    p.add_argument("--examples", type=int, default=3, help="fill-mask examples to show (default 3)")
    p.add_argument("--seed", type=int, default=0, help="which tokens are blanked")
    p.add_argument("--json", type=Path, help="also write the figures and examples to this JSON file")
    return p


@exit_on_pipeline_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    from pipeline.common.atomic_files import write_json_atomic
    from pipeline.hub import Encoder
    from pipeline.hub.cloze import cloze_score, fill_mask_examples, validation_texts
    from pipeline.pretrain.export.folder import export_for_loading

    torch.set_num_threads(max(1, min(torch.get_num_threads(), os.cpu_count() or 1)))
    encoder = Encoder.from_pretrained(args.model, exporter=export_for_loading)
    texts = validation_texts(args.shards, encoder.tokenizer)
    score = cloze_score(encoder, texts, mask_rate=args.mask_rate, seed=args.seed, max_texts=args.max_texts)
    examples = fill_mask_examples(encoder, texts, count=args.examples, topk=3, seed=args.seed)
    print(f"cloze accuracy {score.accuracy:.3f}: top-1 right at {score.correct:,} of {score.masked:,} masked tokens "
          f"in {score.texts} validation texts (always guessing the most frequent token: {score.constant_accuracy:.3f})")
    for example in examples:
        top = ", ".join(f"{token!r} {prob:.2f}" for token, prob in example.top)
        print(f"  {example.masked_text!r}\n    answer {example.answer!r}; top 3: {top}")
    if args.json:
        write_json_atomic(args.json, {
            "model": str(args.model), "shards": str(args.shards), "mask_rate": args.mask_rate, "seed": args.seed,
            "accuracy": score.accuracy, "correct": score.correct, "masked": score.masked, "texts": score.texts,
            "constant_accuracy": score.constant_accuracy,
            "examples": [{"masked_text": e.masked_text, "answer": e.answer,
                          "top": [{"token": t, "probability": pr} for t, pr in e.top]} for e in examples]})


if __name__ == "__main__":
    main()
