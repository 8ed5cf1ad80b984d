"""Loader capacity: the sequences per second one DataLoader worker delivers, against what one H100 consumes.

    python benchmarks/loader_capacity.py [--input CORPUS] [--seq-lens 512 1024] [--micro-batch 32] [--batches 60]

For each sequence length and masking unit, the training loader as the trainer builds it (`train_loader`:
the shard cache, the epoch order, `MaskedBatches`, one worker process) is read for `--batches` micro
batches after a warm-up. One H100 consumes: RoBERTa-large (sparse head at 15%) at 45% MFU of 989 TFLOP/s
(H100 SXM bf16 dense) ÷ `flops.training_flops_per_token`, and ModernBERT-base at 300k tokens/s. The goal:
two workers per GPU deliver twice that. Text: `--input` (any `shard.py` input; default the embedded
corpus), with an 8k BPE trained here.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import harness
from gpu_check import MFU_TARGET, TOKENS_TARGET, nominal_tflops

STUDY = harness.Study(
    "loader_capacity", question="Can two loader workers feed one H100?",
    metric="sequences per second one DataLoader worker delivers",
    baseline="what one H100 consumes at the GPU targets (RoBERTa-large at 45% MFU, ModernBERT-base at 300k tokens/s)",
    arms=("token masking", "whole-word masking", "span masking"))
WORKERS_PER_GPU, HEADROOM = 2, 2.0
UNITS = ("token", "word", "span")


def gpu_demand(seq_len: int) -> dict[str, float]:
    """Sequences per second one H100 consumes at each target."""
    from pipeline.pretrain.flops import training_flops_per_token

    flops = training_flops_per_token(layers=24, hidden=1024, intermediate=4096, seq_len=seq_len, vocab=50265,
                                     masked_fraction=0.15)
    roberta = MFU_TARGET * nominal_tflops("H100") * 1e12 / flops  # the data sheet's dense bf16 peak
    return {"RoBERTa-large, 45% MFU": roberta / seq_len, "ModernBERT-base, 300k tokens/s": TOKENS_TARGET / seq_len}


def worker_rate(shards: Path, cache_dir: Path, tokenizer_dir: Path, unit: str, micro_batch: int,
                batches: int) -> float:
    """Sequences per second one DataLoader worker delivers through the training loader."""
    from transformers import AutoTokenizer

    from pipeline.data.token_cache import TokenCache
    from pipeline.data.tokenizer import describe_tokenizer
    from pipeline.pretrain.batch_plan import BatchPlan
    from pipeline.pretrain.batches import MaskedBatches, shut_down_workers, train_loader
    from pipeline.pretrain.config import MaskingConfig
    from pipeline.pretrain.masking import build_masker
    from pipeline.pretrain.stream import CorpusLayout, DataStream

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    info = describe_tokenizer(tokenizer)
    cache = TokenCache(shards, "train", cache_dir)
    masker = build_masker(MaskingConfig(unit=unit), tokenizer, info.vocab_size, info.mask_id, seed=0)
    corpus = CorpusLayout("corpus", str(shards), 0, cache.layout.sizes, cache.layout.shards_per_block, cache.seq_len)
    shuffle = DataStream([corpus], BatchPlan.derive(micro_batch, micro_batch, 1), seed=0)
    warm = 4
    steps = warm + batches  # past an epoch the order wraps: the rate is the same
    loader = iter(train_loader(MaskedBatches(cache, masker, with_segments=False), shuffle, rank=0, start_step=0,
                               end_step=steps, num_workers=1))
    try:
        for _ in range(warm):  # the worker's start, its first shard fills and prefetch queue
            next(loader)
        start = time.perf_counter()
        for _ in range(batches):
            next(loader)
        return batches * micro_batch / (time.perf_counter() - start)
    finally:
        shut_down_workers(loader)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", default=None, help="corpus for shard.py; default: the embedded corpus")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024])
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--batches", type=int, default=60, help="micro batches timed per configuration")
    args = p.parse_args()
    with STUDY.record() as rec:
        measure(args, rec)


def measure(args: argparse.Namespace, rec: harness.BenchmarkRecord) -> None:
    import torch

    from pipeline.data.tokenizer import train_tokenizer

    torch.set_num_threads(1)
    rows, worst = [], None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _, texts, _ = harness.sample_corpus(args.input, 20_000, tmp)  # the tokenizer's texts
        corpus = Path(args.input) if args.input else tmp / "embedded.jsonl"
        train_tokenizer(texts, "bpe", 8000, tmp / "tok", model_max_length=max(args.seq_lens))
        for seq_len in args.seq_lens:
            shards = harness.make_shards(corpus, tmp / "tok", tmp / f"shards{seq_len}", seq_len, workers=2,
                                         val_fraction=0.01)
            demand = gpu_demand(seq_len)
            for unit in UNITS:
                rate = worker_rate(shards, tmp / "cache", tmp / "tok", unit, args.micro_batch, args.batches)
                for target, need in demand.items():
                    ratio = rate / need  # one worker against one GPU: ≥ 1 is 2 workers with 2× headroom
                    rows.append({"seq_len": seq_len, "masking": unit, "one worker (seq/s)": f"{rate:,.0f}",
                                 "GPU target": target, "H100 consumes (seq/s)": f"{need:,.0f}",
                                 "2 workers ÷ demand": f"{WORKERS_PER_GPU * ratio:.1f}×"})
                    if worst is None or ratio < worst[0]:
                        worst = (ratio, seq_len, unit, target)
    rec.table(f"one DataLoader worker (micro batch {args.micro_batch}, {args.batches} batches timed, 1 torch thread) "
              "against one H100's consumption", rows)
    ratio, seq_len, unit, target = worst
    rec.headline("2 workers per GPU ÷ the GPU's consumption, worst case",
                 f"{WORKERS_PER_GPU * ratio:.1f}× (seq {seq_len}, {unit} masking, {target})",
                 target=f"≥ {HEADROOM:.0f}×", met=WORKERS_PER_GPU * ratio >= HEADROOM)


if __name__ == "__main__":
    main()
