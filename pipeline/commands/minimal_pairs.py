"""Minimal-pair accuracy of a masked-LM: the share of pairs whose good sentence has the higher pseudo-log-likelihood.

    python launchers/minimal_pairs.py --model runs/default/pretrain/export --pairs pairs.jsonl \\
        [--group-by phenomenon] [--corpus corpus.jsonl] [--out result.json]

`--pairs` holds JSON lines `{"sentence_good": ..., "sentence_bad": ..., ...}`, the format of the
public linguistic minimal-pair suites (BLiMP's lines carry `UID`, `linguistics_term`, `field`);
`python data_prep/make_minimal_pairs.py` makes such a file from held-out text. Each sentence
is scored once by `Encoder.score` (pipeline/hub/pseudo_likelihood.py), and a pair counts when
the good sentence scores higher; a tie counts half (chance), and ties are reported.
`--precision auto` (the default) scores in bf16 autocast on a CPU with native bf16 and in fp32
elsewhere; the precision used is printed and written.

`--group-by FIELD` adds the accuracy per value of that field. `--corpus` also scores the pairs
with a unigram model of that corpus under the same tokenizer (pipeline/hub/unigram_baseline.py):
what a model that knows only word frequencies gets. `--out` writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from pipeline.common.errors import exit_on_pipeline_error
from pipeline.hub.minimal_pairs import pair_scores, read_pairs, summarize


def _table(model: dict, unigram: dict | None) -> str:
    rows = [("all", model["overall"], unigram and unigram["overall"])]
    rows += [(g, r, unigram and unigram["groups"][g]) for g, r in model.get("groups", {}).items()]
    width = max(len(name) for name, _, _ in rows)
    head = f"{'group':<{width}}  pairs  model" + ("  unigram" if unigram else "")
    lines = [head]
    for name, r, u in rows:
        line = f"{name:<{width}}  {r['pairs']:>5}  {r['accuracy']:.3f}"
        if u:
            line += f"  {u['accuracy']:.3f}" + (f" ({u['ties']} ties)" if u["ties"] else "")
        lines.append(line)
    return "\n".join(lines)


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="an export, pretraining output folder, checkpoint or hub name")
    p.add_argument("--pairs", required=True, type=Path, help="JSON lines with sentence_good and sentence_bad")
    p.add_argument("--group-by", help="also report the accuracy per value of this field (e.g. phenomenon, UID)")
    p.add_argument("--corpus", nargs="+", help="corpus files, folders or globs (.txt/.jsonl/.parquet, .zst/.gz) for "
                                               "the unigram baseline under the model's tokenizer")
    p.add_argument("--text-field", default="text", help="the text field of --corpus .jsonl records (text)")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="rows × length of one forward over masked copies (default 2048)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="bf16 autocasts the forwards (2-4.5x faster with native bf16, PLL within ~0.02 nats); "
                        "auto: bf16 where the CPU computes it natively (avx512_bf16, amx_bf16), else fp32")
    p.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    from pipeline.common.atomic_files import write_json_atomic
    from pipeline.hub import Encoder
    from pipeline.hub.pseudo_likelihood import DEFAULT_BATCH_TOKENS, check_can_score
    from pipeline.models.precision import native_bf16
    from pipeline.pretrain.export.folder import export_for_loading

    pairs = read_pairs(args.pairs, args.group_by)  # before loading the model: a bad file fails fast
    torch.set_num_threads(max(1, min(torch.get_num_threads(), os.cpu_count() or 1)))
    encoder = Encoder.from_pretrained(args.model, exporter=export_for_loading)
    check_can_score(encoder)
    batch_tokens = args.batch_tokens or DEFAULT_BATCH_TOKENS
    precision = args.precision if args.precision != "auto" else ("bf16" if native_bf16() else "fp32")
    started = time.perf_counter()
    scored = pair_scores(pairs, lambda s: encoder.score(s, batch_tokens=batch_tokens, precision=precision))
    seconds = time.perf_counter() - started
    result = {"model": str(args.model), "pairs_file": str(args.pairs), "group_by": args.group_by,
              "precision": precision, "seconds": round(seconds, 3), "pairs_per_second": round(len(pairs) / seconds, 1),
              "model_scores": summarize(pairs, scored)}
    unigram = None
    if args.corpus:
        from pipeline.hub.unigram_baseline import UnigramModel

        baseline = UnigramModel.from_corpus(args.corpus, encoder.tokenizer, args.text_field)
        unigram = summarize(pairs, pair_scores(pairs, baseline.score))
        result.update(corpus=args.corpus, corpus_tokens=baseline.tokens, unigram_scores=unigram)
    print(_table(result["model_scores"], unigram))
    print(f"{len(pairs)} pairs in {seconds:.1f} s: {result['pairs_per_second']:.1f} pairs/s "
          f"(pseudo-log-likelihood, {precision}, {torch.get_num_threads()} threads)")
    if args.out:
        write_json_atomic(args.out, result)
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
