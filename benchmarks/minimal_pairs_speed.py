"""Minimal pairs per second: pseudo-log-likelihood scoring of the main job's model on the CPU.

    python benchmarks/minimal_pairs_speed.py [--export runs/default/pretrain/export] [--threads 2] [--rounds 2]

The model is the main job's shape (configs/main-job.json: ModernBERT, 2 layers × hidden 128,
GeGLU 512, local window 64, sequence 128) with a 2,000-token byte-level BPE trained on the
embedded corpus (pipeline/data/default_corpus.py), as the main job trains it. Without
`--export` its weights are random: the cost of a forward does not depend on the weights, so
pairs/s is the same, but the accuracy printed beside it is meaningless (near 0.5). With
`--export`, the main job's real export and its own tokenizer are scored instead.

The pairs are made from the held-out documents (the shard stage's 5% validation split) of the
embedded corpus by pipeline/data/minimal_pair_maker.py: agreement, determiner and word-order
swaps. Each round scores every pair through `Encoder.score`, as `launchers/minimal_pairs.py`
does (each distinct sentence once), in fp32 and in bf16 autocast; the best round's wall time of
each counts. On a shared machine the wall time depends on the other work: "pairs per CPU-second"
(process time, all threads) is printed beside it, and the record keeps the load averages. The
headline is the precision `--precision auto` picks on the machine (bf16 where
the CPU has native bf16). Target: 200 pairs/s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.result_record import BenchmarkRecord  # noqa: E402

SEQ_LEN = 128
VOCAB_SIZE = 2000
TARGET = 200.0


def random_main_job_model(out: Path, corpus: Path) -> Path:
    """The main job's architecture with random weights and its 2,000-token BPE, saved as an export folder."""
    from transformers import ModernBertForMaskedLM

    from pipeline.common.config_tree import build_config
    from pipeline.data.corpus import iter_texts, resolve_inputs
    from pipeline.data.corpus_types import CorpusOptions
    from pipeline.data.tokenizer import describe_tokenizer, train_tokenizer
    from pipeline.pretrain.config import ModelConfig
    from pipeline.pretrain.model import hf_config

    tokenizer = train_tokenizer(iter_texts(resolve_inputs([str(corpus)]), CorpusOptions()), "bpe", VOCAB_SIZE,
                                out / "tokenizer", model_max_length=SEQ_LEN)
    shape, problems = build_config(ModelConfig, json.loads((ROOT / "configs/main-job.json").read_text())["model"])
    if problems:
        raise SystemExit("configs/main-job.json model: " + "; ".join(problems))
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(hf_config(shape, describe_tokenizer(tokenizer), SEQ_LEN))
    model.save_pretrained(out / "export")
    tokenizer.save_pretrained(out / "export")
    return out / "export"


def record_name(threads: int) -> str:
    """The 2-thread run is the benchmark's figure; other thread counts are variants beside it."""
    return "minimal_pairs_speed" if threads == 2 else f"minimal_pairs_speed.{threads}-thread"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--export", type=Path, help="the main job's export (default: its architecture, random weights)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--per-phenomenon", type=int, default=200, help="pairs of each phenomenon, at most")
    p.add_argument("--batch-tokens", type=int, default=None, help="rows × length per forward (Encoder.score's default)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from pipeline.commands.minimal_pairs import Pair, pair_scores, summarize
    from pipeline.common.cpu_precision import native_bf16
    from pipeline.data.default_corpus import write_embedded_corpus
    from pipeline.data.minimal_pair_maker import held_out_texts, make_pairs
    from pipeline.data.shard_options import DEFAULT_VAL_FRACTION
    from pipeline.hub import Encoder
    from pipeline.hub.pseudo_likelihood import DEFAULT_BATCH_TOKENS

    batch_tokens = a.batch_tokens or DEFAULT_BATCH_TOKENS
    with tempfile.TemporaryDirectory() as tmp, BenchmarkRecord(record_name(a.threads), sys.argv) as rec:
        corpus = Path(tmp) / "corpus.jsonl"
        write_embedded_corpus(corpus)
        model_dir = a.export or random_main_job_model(Path(tmp), corpus)
        encoder = Encoder.from_pretrained(model_dir)
        raw = make_pairs(held_out_texts([str(corpus)], DEFAULT_VAL_FRACTION), per_phenomenon=a.per_phenomenon)
        pairs = [Pair(r["sentence_good"], r["sentence_bad"], r["phenomenon"]) for r in raw]
        lengths = [len(encoder.tokenizer(s)["input_ids"]) for pr in pairs for s in (pr.good, pr.bad)]
        weights = "random weights" if a.export is None else f"export {a.export}"
        default = "bf16" if native_bf16() else "fp32"  # what the command's --precision auto picks here
        rows, rates = [], {}
        for precision in ("fp32", "bf16"):
            best = best_cpu = float("inf")
            for _ in range(a.rounds):  # the best round of each precision counts
                start, start_cpu = time.perf_counter(), time.process_time()
                scored = pair_scores(pairs, lambda s, p=precision: encoder.score(s, batch_tokens=batch_tokens,
                                                                                 precision=p))
                best = min(best, time.perf_counter() - start)
                best_cpu = min(best_cpu, time.process_time() - start_cpu)
            rates[precision] = len(pairs) / best
            summary = summarize(pairs, scored)
            print(f"{precision}: {len(pairs)} pairs, {sum(lengths) / len(lengths):.1f} tokens per sentence: best round "
                  f"{best:.2f} s, {rates[precision]:.0f} pairs/s on {a.threads} threads ({weights}; accuracy "
                  f"{summary['overall']['accuracy']:.3f})", flush=True)
            rows.append({"model": f"main-job shape, {weights}", "precision": precision, "pairs": len(pairs),
                         "tokens per sentence (mean)": round(sum(lengths) / len(lengths), 1), "threads": a.threads,
                         "batch tokens": batch_tokens, "best round s": round(best, 3),
                         "pairs/s": round(rates[precision], 1),
                         "pairs per CPU-second": round(len(pairs) / best_cpu, 1),
                         "accuracy": round(summary["overall"]["accuracy"], 3)})
        rate = rates[default]
        rec.table("Encoder.score over minimal pairs from the embedded corpus's held-out documents "
                  f"(best of {a.rounds} rounds, wall time)", rows,
                  note="random weights: the speed is the model's, the accuracy is not" if a.export is None else None)
        rec.headline(f"pairs per second ({default}, the command's default on this CPU)", round(rate, 1),
                     target=f"≥ {TARGET:.0f} on 2 cores", met=rate >= TARGET, unit="pairs/s")


if __name__ == "__main__":
    main()
