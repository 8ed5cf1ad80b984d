"""Masking collator speed and realised statistics: each masking unit against token masking and HF's collator.

    python benchmarks/collator_throughput.py [--rows 64] [--seq-len 512] [--repeats 30]

All mask 64 × 512 batches of real token ids (the embedded corpus, tokenized with a BPE tokenizer
trained here) at 15%:
- ours: `MaskedBatches[key]`, the whole DataLoader item: gather rows from the memory-mapped token
  cache, hash-based masks, tensors out; for each `masking.unit` (token, word, span);
- HF:   `DataCollatorForLanguageModeling(tokenizer)` on the examples as a `datasets` map gives them
  to the Trainer (dicts of token-id lists), and on dicts of tensors (its fastest input); and with
  `whole_word_mask=True` (transformers 5's whole-word masking, which needs each example's
  `offset_mapping` from tokenization time) on tensors with offsets. HF has no span masking.
Then one training step (forward, backward, optimizer) of the train_throughput model (4 layers,
hidden 256, sparse head) on the same batch, to show each collator's share of a step; and each
unit's realised statistics over at least a million tokens of the corpus (several epochs of masks
if the corpus is smaller): masked fraction, fraction of touched words wholly masked, and the span
length histogram against SpanBERT's geometric target.
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
from result_record import BenchmarkRecord  # noqa: E402


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
    p.add_argument("--stat-tokens", type=int, default=1_000_000, help="tokens masked for the statistics")
    args = p.parse_args()
    with BenchmarkRecord("collator_throughput", argv=sys.argv) as rec:
        measure(args, rec)


def measure(args: argparse.Namespace, rec: BenchmarkRecord) -> None:
    import numpy as np
    import torch
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    from pipeline.data.default_corpus import write_embedded_corpus
    from pipeline.data.shard_options import ShardOptions
    from pipeline.data.shard_stage import run_shard_stage
    from pipeline.data.token_cache import TokenCache
    from pipeline.data.tokenizer import describe_tokenizer, train_tokenizer
    from pipeline.pretrain.batches import MaskedBatches, MicroBatchKey
    from pipeline.pretrain.config import MaskingConfig, ModelConfig
    from pipeline.pretrain.masking import build_masker, mask_statistics, span_length_distribution
    from pipeline.pretrain.model import build_model

    units = ("token", "word", "span")
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
        maskers = {unit: build_masker(MaskingConfig(unit=unit), tokenizer, info.vocab_size, info.mask_id, seed=0)
                   for unit in units}
        key = MicroBatchKey(0, rows)
        ids = np.asarray(cache.fields["input_ids"][rows]).astype(np.int64)
        as_lists = [{"input_ids": row.tolist()} for row in ids]
        as_tensors = [{"input_ids": torch.from_numpy(row)} for row in ids]
        hf = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
        # HF's whole-word masking reads word boundaries from character offsets, so it needs the
        # examples as tokenized from text (the shards keep ids only); made here, outside the timing.
        long_texts = [t for t in texts if len(t) > 4 * args.seq_len][: args.rows]
        encoded = tokenizer(long_texts, truncation=True, max_length=args.seq_len, padding="max_length",
                            return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
        with_offsets = [{k: encoded[k][i] for k in ("input_ids", "offset_mapping", "special_tokens_mask")}
                        for i in range(len(long_texts))]
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "random token replacement is not supported with whole word masking"
            hf_wwm = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, whole_word_mask=True)

        torch.set_num_threads(2)
        ours = {unit: MaskedBatches(cache, maskers[unit], with_segments=False) for unit in units}
        t_ours = {unit: best_of(lambda b=ours[unit]: b[key], args.repeats) for unit in units}
        t_hf_lists = best_of(lambda: hf(as_lists), args.repeats)
        t_hf_tensors = best_of(lambda: hf(as_tensors), args.repeats)
        t_hf_wwm = best_of(lambda: hf_wwm(with_offsets), args.repeats)

        model_config = ModelConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
        model = build_model(model_config, info, args.seq_len)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        batch = MaskedBatches(cache, maskers["token"], with_segments=False)[key]

        def train_step():
            loss = model(**batch)["loss"]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        t_step = best_of(train_step, max(3, args.repeats // 10))

        # Statistics over ≥ stat_tokens tokens: the whole train split, with a new mask each epoch.
        all_ids = np.asarray(cache.fields["input_ids"][:]).astype(np.int64)
        epochs = -(-args.stat_tokens // all_ids.size)
        stats = {}
        for unit, masker in maskers.items():
            labels = np.concatenate([masker(all_ids, e, np.arange(len(all_ids)))[1] for e in range(epochs)])
            # Words as the vocabulary delimits them, for every unit (the token masker has no word table).
            stats[unit] = mask_statistics(maskers["word"], np.concatenate([all_ids] * epochs), labels)

    print(f"batch {args.rows} × {args.seq_len} tokens, median of {args.repeats} calls, 2 threads\n")
    print("| collator | ms per batch | × token masking | share of a training step |")
    print("|---|---|---|---|")
    cost = []
    for unit in units:
        print(f"| ours, masking.unit={unit} (gather + mask + tensors) | {t_ours[unit] * 1e3:.2f} | "
              f"{t_ours[unit] / t_ours['token']:.2f} | {100 * t_ours[unit] / t_step:.3f}% |")
        cost.append({"collator": f"ours, `masking.unit={unit}` (gather + mask + tensors)",
                     "ms per batch": f"{t_ours[unit] * 1e3:.2f}",
                     "× our token masking": f"{t_ours[unit] / t_ours['token']:.2f}",
                     "share of a training step": f"{100 * t_ours[unit] / t_step:.3f}%"})
    for name, t in (("HF DataCollatorForLanguageModeling, list inputs", t_hf_lists),
                    ("HF DataCollatorForLanguageModeling, tensor inputs", t_hf_tensors),
                    ("HF DataCollatorForLanguageModeling(whole_word_mask=True), tensors + offsets", t_hf_wwm)):
        print(f"| {name} | {t * 1e3:.2f} | {t / t_ours['token']:.2f} | {100 * t / t_step:.3f}% |")
        cost.append({"collator": name, "ms per batch": f"{t * 1e3:.2f}",
                     "× our token masking": f"{t / t_ours['token']:.2f}",
                     "share of a training step": f"{100 * t / t_step:.3f}%"})
    rec.table(f"cost ({args.rows} × {args.seq_len} batch, median of {args.repeats} calls, 2 threads; training step "
              f"{t_step * 1e3:.0f} ms)", cost)
    dearest = max(units, key=lambda u: t_ours[u])
    rec.headline("dearest masking unit's share of a training step",
                 f"{100 * t_ours[dearest] / t_step:.3f}% ({dearest})", target="< 1%",
                 met=t_ours[dearest] / t_step < 0.01)
    rec.headline("whole-word masking, ours vs HF's whole-word collator", f"{t_hf_wwm / t_ours['word']:.1f}× faster")
    print(f"\nours vs HF: token masking {min(t_hf_lists, t_hf_tensors) / t_ours['token']:.1f}× faster, "
          f"whole-word masking {t_hf_wwm / t_ours['word']:.1f}× faster")
    print(f"training step (4 layers, hidden 256, sparse head, same batch): {t_step * 1e3:.0f} ms\n")

    tokens = epochs * all_ids.size
    print(f"realised over {tokens:,} tokens ({len(all_ids)} sequences × {epochs} epochs of masks), target 15%:\n")
    print("| unit | masked fraction | touched words wholly masked | mean span (words) |")
    print("|---|---|---|---|")
    realised_rows = []
    for unit, s in stats.items():
        runs = s.run_lengths
        mean = (runs @ np.arange(len(runs))) / max(runs.sum(), 1)
        realised_rows.append({"unit": unit, "masked fraction": f"{100 * s.masked_fraction:.2f}%",
                              "touched words wholly masked": f"{100 * s.whole_word_fraction:.1f}%",
                              "mean span (words)": f"{mean:.2f}" if unit == "span" else "—"})
        print(f"| {unit} | {100 * s.masked_fraction:.2f}% | {100 * s.whole_word_fraction:.1f}% | "
              f"{mean:.2f} |" if unit == "span" else f"| {unit} | {100 * s.masked_fraction:.2f}% | "
              f"{100 * s.whole_word_fraction:.1f}% | — |")
    rec.table(f"realised over {tokens:,} tokens, target 15%", realised_rows)
    target = span_length_distribution(0.2, 10)
    runs = stats["span"].run_lengths[1:11]
    realised = runs / runs.sum()
    print(f"\nspan lengths in words ({int(runs.sum()):,} spans) against geometric(0.2) truncated at 10:\n")
    print("| length | " + " | ".join(str(k) for k in range(1, 11)) + " |")
    print("|---|" + "---|" * 10)
    print("| realised | " + " | ".join(f"{x:.3f}" for x in realised) + " |")
    print("| target | " + " | ".join(f"{x:.3f}" for x in target) + " |")
    rec.table(f"span lengths in words ({int(runs.sum()):,} spans) vs geometric(0.2) truncated at 10",
              [{"length": name, **{str(k): f"{x:.3f}" for k, x in zip(range(1, 11), values, strict=True)}}
               for name, values in (("realised", realised), ("target", target))])
    rec.headline("largest span-length difference from the target distribution",
                 f"{np.abs(realised - target).max():.4f}")
    print(f"\nlargest difference {np.abs(realised - target).max():.4f}; realised mean "
          f"{realised @ np.arange(1, 11):.2f}, target {target @ np.arange(1, 11):.2f}")


if __name__ == "__main__":
    main()
