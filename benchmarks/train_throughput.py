"""Training throughput and MFU: our pretraining step against HF Trainer, in one run.

    python benchmarks/train_throughput.py [--corpus FILE] [--steps 20] [--skip 5] [--batch 32] [--seq-len 128]

Same model (4 layers, hidden 256, FFN 1024, a 50,265-token BPE trained here on the shared IMDB reviews
or the embedded corpus, seq 128), data, batch, AdamW settings, fp32 and threads. Ours is
`launchers/pretrain.py` as a user runs it (ZeRO 0, hashed masking, the sparse MLM head, the loader in the
training process, per-tensor AdamW), timed from its metrics.jsonl; HF is `Trainer` +
`RobertaForMaskedLM` + `DataCollatorForLanguageModeling` with its defaults, timed from a callback. The
first `--skip` steps are warm-up. The peak is a 4096² fp32 `torch.mm` with the same threads, best of 5,
before every run; the best of those counts. MFU follows PaLM (the FLOPs the model's math needs,
pipeline/pretrain/flops.py): ours counts its head at the masked fraction, HF's at every position;
"dense-equivalent" counts the dense head for both, so its ratio is the tokens/s speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import harness

MODEL = dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
MASKED = 0.15  # masking.probability (the default)
OPTIMIZER = dict(lr=5e-4, betas=[0.9, 0.98], eps=1e-6, weight_decay=0.01)
STUDY = harness.Study(
    "train_throughput", question="Is the pretraining step fast?", metric="tokens/s and MFU over the counted steps",
    baseline="HF Trainer + RobertaForMaskedLM + DataCollatorForLanguageModeling, same model, batch, data and threads",
    arms=("ours", "HF Trainer"))


def hf_worker(shards: str, tokenizer_dir: str, steps: int, batch: int) -> None:
    """Train with HF Trainer; print the wall-clock time at the end of every step as JSON."""
    import torch
    from transformers import (
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        RobertaForMaskedLM,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from pipeline.data.shard_reader import ShardedDataset
    from pipeline.data.tokenizer import describe_tokenizer
    from pipeline.pretrain.config import ModelConfig
    from pipeline.pretrain.model import hf_config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    data = ShardedDataset(shards, "train")
    examples = [{"input_ids": torch.from_numpy(data[i]["input_ids"].astype("int64"))}
                for i in range(min(len(data), steps * batch))]
    config = hf_config(ModelConfig(**MODEL), describe_tokenizer(tokenizer), data.seq_len)
    torch.manual_seed(0)
    model = RobertaForMaskedLM(config)
    stamps: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=batch, max_steps=steps, learning_rate=OPTIMIZER["lr"],
            adam_beta1=OPTIMIZER["betas"][0], adam_beta2=OPTIMIZER["betas"][1], adam_epsilon=OPTIMIZER["eps"],
            weight_decay=OPTIMIZER["weight_decay"], warmup_steps=2, max_grad_norm=1.0, logging_steps=10**6,
            save_strategy="no", report_to="none", dataloader_num_workers=0, use_cpu=True, seed=0)
        trainer = Trainer(model=model, args=args, train_dataset=examples,
                          data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15),
                          callbacks=[StepClock()])
        trainer.train()
    print(json.dumps({"stamps": stamps}))


def ours(shards: Path, tokenizer_dir: Path, a: argparse.Namespace, out: Path, env: dict) -> float:
    """Seconds per counted step of `launchers/pretrain.py` as a user runs it, from its metrics.jsonl."""
    config = {
        "model": MODEL, "data": {"shards": str(shards), "tokenizer": str(tokenizer_dir), "num_workers": 0,
                                 "cache_dir": str(out.parent / "token_cache")},
        "optimizer": OPTIMIZER, "schedule": {"warmup_steps": 2},
        "train": {"output_dir": str(out), "max_steps": a.steps, "global_batch_size": a.batch,
                  "micro_batch_size": a.batch, "eval_sequences": a.batch, "export": False, "log_every": 1},
        "checkpoint": {"every": 10**6}, "tracking": {"enabled": False},
    }
    path = out.parent / f"{out.name}.json"
    path.write_text(json.dumps(config))
    harness.launch([sys.executable, "launchers/pretrain.py", "--config", path], env=env,
                   log=out.parent / f"{out.name}.log")
    seconds, counted, previous = 0.0, 0, 0
    for r in (r for r in harness.metrics(out) if "train/loss" in r):  # covers the steps since the previous record
        if previous >= a.skip:
            seconds += (r["step"] - previous) * a.batch / r["train/samples_per_s"]
            counted += r["step"] - previous
        previous = r["step"]
    return seconds / counted


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default=None, help="jsonl(.zst) corpus (default: shared IMDB, else embedded)")
    p.add_argument("--documents", type=int, default=20_000, help="documents used to train the tokenizer and shard")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--skip", type=int, default=5, help="warm-up steps not counted (a multiple of 5)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--hf-worker", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.hf_worker:
        shards, tok, steps, batch = a.hf_worker
        return hf_worker(shards, tok, int(steps), int(batch))
    if a.skip % 5 or a.skip >= a.steps:
        p.error("--skip must be a multiple of 5 and below --steps")
    with STUDY.record() as rec:
        measure(a, rec)


def measure(a: argparse.Namespace, rec: harness.BenchmarkRecord) -> None:
    from pipeline.data.tokenizer import train_tokenizer
    from pipeline.pretrain.flops import training_flops_per_token

    env = harness.cpu_env(a.threads)
    peaks, seconds = [], {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = a.corpus or (str(harness.IMDB) if harness.IMDB.exists() else None)
        source, texts, corpus = harness.sample_corpus(source, a.documents, tmp)
        tok = tmp / "tokenizer"
        train_tokenizer(texts, "bpe", 50_265, tok, model_max_length=a.seq_len)
        shards = harness.make_shards(corpus, tok, tmp / "shards", a.seq_len, val_fraction=0.01, workers=a.threads)
        vocab = json.loads((shards / "index.json").read_text())["tokenizer"]["vocab_size"]
        peaks.append(harness.peak_flops(a.threads))
        seconds["ours"] = ours(shards, tok, a, tmp / "ours", env)
        peaks.append(harness.peak_flops(a.threads))
        hf = harness.launch([sys.executable, __file__, "--hf-worker", shards, tok, a.steps, a.batch], env=env,
                            capture=True)
        stamps = json.loads(hf.output.strip().splitlines()[-1])["stamps"]
        counted = [b - a_ for a_, b in zip(stamps, stamps[1:], strict=False)][a.skip - 1:]
        seconds["hf"] = sum(counted) / len(counted)
        peaks.append(harness.peak_flops(a.threads))

    peak, tokens = max(peaks), a.batch * a.seq_len
    shape = dict(layers=MODEL["num_hidden_layers"], hidden=MODEL["hidden_size"],
                 intermediate=MODEL["intermediate_size"], seq_len=a.seq_len, vocab=vocab)
    dense = training_flops_per_token(**shape, masked_fraction=None)
    rows = []
    for name, step in seconds.items():
        # PaLM's convention: the FLOPs the model's math needs (ours: the sparse head at the masked fraction)
        flops = tokens * (dense if name == "hf" else training_flops_per_token(**shape, masked_fraction=MASKED)) / step
        rows.append({"training step": "HF Trainer + RobertaForMaskedLM + DataCollatorForLanguageModeling"
                     if name == "hf" else "ours", "ms per step": f"{1e3 * step:,.0f}",
                     "tokens/s": f"{tokens / step:,.0f}", "model GFLOP/s": f"{flops / 1e9:.1f}",
                     "MFU": f"{flops / peak:.0%}", "dense-equivalent / peak": f"{tokens * dense / step / peak:.0%}",
                     "vs HF": f"{seconds['hf'] / step:.2f}"})
    rec.table(f"4 layers, hidden 256, vocabulary {vocab:,}, seq {a.seq_len}, batch {a.batch}, fp32, {a.threads} "
              f"threads, {a.steps} steps ({a.skip} warm-up not counted); peak {peak / 1e9:.1f} GFLOP/s "
              f"(4096² fp32 torch.mm, best of 5, before every run: {', '.join(f'{x / 1e9:.0f}' for x in peaks)})",
              rows)
    rec.headline("ours vs HF Trainer", f"{seconds['hf'] / seconds['ours']:.2f}×")
    print(f"\nwall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
