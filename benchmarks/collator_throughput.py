"""Masking collator speed: ours against HF's `DataCollatorForLanguageModeling`, on the same batch.

    python benchmarks/collator_throughput.py [--rows 64] [--seq-len 512] [--repeats 30]

Both mask the same 64 × 512 batch of real token ids (the embedded corpus, tokenized with a BPE
tokenizer trained here) at 15%, 80/10/10:
- ours: `MaskedBatches[key]`, the whole DataLoader item: gather rows from the memory-mapped
  token cache, hash-based masks, tensors out;
- HF:   `DataCollatorForLanguageModeling(tokenizer)` on the examples as a `datasets` map gives
  them to the Trainer (dicts of token-id lists), and again on dicts of tensors (its fastest input).
Then one training step (forward, backward, optimizer) of the train_throughput model (4 layers,
hidden 256, sparse head) on the same batch, to show the collator's share of a step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def best_of(fn, repeats: int) -> float:
    """Median seconds of `fn()` over `repeats` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()

    import numpy as np
    import torch
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    from pipeline.data.default_corpus import write_embedded_corpus
    from pipeline.data.shard_options import ShardOptions
    from pipeline.data.shard_stage import run_shard_stage
    from pipeline.data.token_cache import TokenCache
    from pipeline.data.tokenizer import describe_tokenizer, train_tokenizer
    from pipeline.pretrain.batches import MaskedBatches, MicroBatchKey
    from pipeline.pretrain.config import ModelConfig
    from pipeline.pretrain.masking import Masker, MaskingSpec
    from pipeline.pretrain.model import build_model

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus.jsonl"
        write_embedded_corpus(corpus)
        texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
        train_tokenizer(texts, "bpe", 8000, tmp / "tok", model_max_length=args.seq_len)
        run_shard_stage(ShardOptions(inputs=(str(corpus),), tokenizer=str(tmp / "tok"), seq_len=args.seq_len,
                                     out=str(tmp / "shards"), workers=2, val_fraction=0.0, quiet=True))
        tokenizer = AutoTokenizer.from_pretrained(tmp / "tok")
        info = describe_tokenizer(tokenizer)
        cache = TokenCache(tmp / "shards", "train", tmp / "cache")
        rows = np.arange(args.rows)
        masker = Masker(MaskingSpec(info.vocab_size, info.mask_id, tuple(tokenizer.all_special_ids)), seed=0)
        ours = MaskedBatches(cache, masker, with_segments=False)
        key = MicroBatchKey(0, rows)
        ids = np.asarray(cache.fields["input_ids"][rows]).astype(np.int64)
        as_lists = [{"input_ids": row.tolist()} for row in ids]
        as_tensors = [{"input_ids": torch.from_numpy(row)} for row in ids]
        hf = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)

        torch.set_num_threads(2)
        t_ours = best_of(lambda: ours[key], args.repeats)
        t_hf_lists = best_of(lambda: hf(as_lists), args.repeats)
        t_hf_tensors = best_of(lambda: hf(as_tensors), args.repeats)

        model_config = ModelConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
        model = build_model(model_config, info, args.seq_len)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        batch = ours[key]

        def train_step():
            loss = model(**batch)["loss"]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        t_step = best_of(train_step, max(3, args.repeats // 10))

    print(f"batch {args.rows} × {args.seq_len} tokens, median of {args.repeats} calls, 2 threads\n")
    print("| collator | ms per batch | ours is × faster |")
    print("|---|---|---|")
    print(f"| ours (gather + mask + tensors) | {t_ours * 1e3:.2f} | 1.0 |")
    print(f"| HF DataCollatorForLanguageModeling, list inputs | {t_hf_lists * 1e3:.2f} | {t_hf_lists / t_ours:.1f} |")
    print(f"| HF DataCollatorForLanguageModeling, tensor inputs | {t_hf_tensors * 1e3:.2f} | "
          f"{t_hf_tensors / t_ours:.1f} |")
    print(f"\ntraining step (4 layers, hidden 256, sparse head, same batch): {t_step * 1e3:.0f} ms; "
          f"ours is {100 * t_ours / t_step:.3f}% of it, HF's {100 * min(t_hf_lists, t_hf_tensors) / t_step:.2f}%")


if __name__ == "__main__":
    main()
