"""A quick look at a trained model from the shell: classify a text (or pair) with a task head, or fill a mask.

    python launchers/predict.py --model DIR --task NAME "text" ["text b"]
    python launchers/predict.py --model DIR --fill-mask "The <mask> is ..." [--topk 5]

DIR is anything `pipeline.hub.Encoder.from_pretrained` loads: a fine-tuning output (its task head
is named after the task), a saved fine-tuned model, an export, a pretraining output folder or
checkpoint, or a hub name.
"""

from __future__ import annotations

import argparse
import os

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.common.errors import PipelineError, exit_on_pipeline_error


@exit_on_pipeline_error
def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="fine-tuning output, model folder, checkpoint or hub name")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--task", help="the classification head to predict with (a fine-tuning output's task)")
    what.add_argument("--fill-mask", metavar="TEXT", help="a text with one <mask>")
    p.add_argument("--topk", type=int, default=5, help="fillings to show (default 5)")
    p.add_argument("texts", nargs="*", help="with --task: one text, or two for a pair")
    args = p.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # exporting a checkpoint on the fly needs no GPU
    if args.task and len(args.texts) not in (1, 2):
        raise PipelineError(f"--task {args.task}: give one text or a pair of texts, got {len(args.texts)}")
    if args.fill_mask and args.texts:
        raise PipelineError("--fill-mask takes its text as its own argument; no other texts")

    import torch

    from pipeline.hub import Encoder

    encoder = Encoder.from_pretrained(args.model)
    if args.fill_mask:
        for filled, prob, token in encoder.fill_mask(args.fill_mask, topk=args.topk):
            print(f"{prob:.4f}\t{token!r}\t{filled}")
        return
    head = encoder.classification_heads[args.task] if args.task in encoder.classification_heads else None
    tokens = encoder.encode(*args.texts, max_length=head.max_seq_len if head else None)
    with torch.no_grad():
        scores = encoder.predict(args.task, tokens)[0]
    labels = encoder.labels(args.task)
    if labels is None:
        print(f"{scores.item():.4f}")
        return
    best = int(scores.argmax())
    print(labels[best])
    for label, log_prob in zip(labels, scores.tolist(), strict=True):
        print(f"  {label}\t{torch.tensor(log_prob).exp().item():.4f}")


if __name__ == "__main__":
    main()
