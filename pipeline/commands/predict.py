"""A quick look at a trained model from the shell: classify a text (or pair), tag words, answer, or fill a mask.

    python launchers/predict.py --model DIR --task NAME "text" ["text b"]
    python launchers/predict.py --model DIR --task ner "EU rejects German call"     # word<TAB>tag per line
    python launchers/predict.py --model DIR --task squad --question Q --context C   # or: --task squad Q C
    python launchers/predict.py --model DIR --fill-mask "The <mask> is ..." [--topk 5]

DIR is anything `pipeline.hub.Encoder.from_pretrained` loads: a fine-tuning output (its task head
is named after the task), a saved fine-tuned model, an export, a pretraining output folder or
checkpoint, or a hub name.
"""

from __future__ import annotations

import argparse
import os

from pipeline.common.errors import PipelineError, exit_on_pipeline_error


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="fine-tuning output, model folder, checkpoint or hub name")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--task", help="the classification head to predict with (a fine-tuning output's task)")
    what.add_argument("--fill-mask", metavar="TEXT", help="a text with one <mask>")
    p.add_argument("--topk", type=int, default=5, help="fillings to show (default 5)")
    p.add_argument("--question", help="with --task of a QA model: the question")
    p.add_argument("--context", help="with --task of a QA model: the text holding the answer")
    p.add_argument("texts", nargs="*", help="with --task: one text, or two for a pair (a QA task: question, context)")
    return p


@exit_on_pipeline_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # exporting a checkpoint on the fly needs no GPU
    qa_flags = args.question is not None or args.context is not None
    if qa_flags and (args.question is None or args.context is None or args.texts or not args.task):
        raise PipelineError("--question and --context go together, with --task and no other texts")
    if args.task and not qa_flags and len(args.texts) not in (1, 2):
        raise PipelineError(f"--task {args.task}: give one text or a pair of texts, got {len(args.texts)}")
    if args.fill_mask and args.texts:
        raise PipelineError("--fill-mask takes its text as its own argument; no other texts")

    import torch

    from pipeline.hub import Encoder
    from pipeline.pretrain.export.folder import export_for_loading

    encoder = Encoder.from_pretrained(args.model, exporter=export_for_loading)
    if args.fill_mask:
        for filled, prob, token in encoder.fill_mask(args.fill_mask, topk=args.topk):
            print(f"{prob:.4f}\t{token!r}\t{filled}")
        return
    if args.task in encoder.span_predictors or qa_flags:
        _span_task(encoder, args)
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


def _span_task(encoder, args) -> None:
    """A token task prints `word<TAB>tag` per word; a QA task prints the answer ("" when there is none)."""
    from pipeline.hub.span_heads import QA, kind_of

    predictor = encoder.span_predictors.get(args.task)
    if args.question is not None or (predictor is not None and kind_of(predictor) == QA):
        question, context = (args.question, args.context) if args.question is not None else (args.texts + [None])[:2]
        if context is None or len(args.texts) > 2:
            raise PipelineError(f"--task {args.task}: give a question and a context (--question Q --context C)")
        print(encoder.answer(question, context, head=args.task))
        return
    words = " ".join(args.texts).split()
    for word, tag in zip(words, encoder.predict(args.task, words), strict=True):
        print(f"{word}\t{tag}")


if __name__ == "__main__":
    main()
