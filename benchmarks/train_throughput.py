"""Training throughput: our pretraining step against HF Trainer + RobertaForMaskedLM, measured in one run.

    python benchmarks/train_throughput.py [--corpus FILE] [--steps 30] [--batch 32] [--seq-len 128]

Same model (4 layers, hidden 256, 4 heads, FFN 1024, a 50,265-token BPE vocabulary trained here,
seq 128, dropout 0.1), same packed sequences, same batch, AdamW with the same settings, fp32,
one process with the same threads, data loading in the training process for both:
- ours: `python launchers/pretrain.py` as a user runs it (DeepSpeed engine, ZeRO 0, the hashed
  masking collator, the sparse MLM head); step times from its metrics.jsonl;
- HF:   `transformers.Trainer` on `RobertaForMaskedLM` with `DataCollatorForLanguageModeling`,
  step times from a callback.
The first `--skip` steps of each are warm-up and not counted. The FLOP model's prediction for the
sparse head (pipeline/pretrain/flops.py) is printed beside the measured ratio.

Default corpus: ../shared/data/corpus/imdb-reviews.jsonl.zst when present, else the embedded one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED_CORPUS = ROOT.parent / "shared" / "data" / "corpus" / "imdb-reviews.jsonl.zst"
MODEL = dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
OPTIMIZER = dict(lr=5e-4, betas=[0.9, 0.98], eps=1e-6, weight_decay=0.01)


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


def ours(shards: Path, tokenizer_dir: Path, steps: int, batch: int, out: Path, env: dict) -> list[float]:
    """Run launchers/pretrain.py; return per-step seconds from its metrics.jsonl."""
    config = {
        "model": MODEL, "data": {"shards": str(shards), "tokenizer": str(tokenizer_dir), "num_workers": 0},
        "optimizer": OPTIMIZER, "schedule": {"warmup_steps": 2},
        "train": {"output_dir": str(out), "max_steps": steps, "global_batch_size": batch, "micro_batch_size": batch,
                  "eval_sequences": batch, "export": False},
        "checkpoint": {"every": 10**6}, "tracking": {"enabled": False},
        "deepspeed": {"zero_optimization": {"stage": 0}},
    }
    path = out.parent / "ours.json"
    path.write_text(json.dumps(config))
    subprocess.run([sys.executable, "launchers/pretrain.py", "--config", str(path)], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [batch / r["train/samples_per_s"] for r in records if "train/loss" in r]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default=None, help="jsonl(.zst) corpus (default: shared IMDB, else embedded)")
    p.add_argument("--documents", type=int, default=20_000, help="documents used to train the tokenizer and shard")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=5, help="warm-up steps not counted")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--hf-worker", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.hf_worker:
        shards, tok, steps, batch = a.hf_worker
        return hf_worker(shards, tok, int(steps), int(batch))

    from bench_corpus import sample_corpus

    from pipeline.data.shard_options import ShardOptions
    from pipeline.data.shard_stage import run_shard_stage
    from pipeline.data.tokenizer import train_tokenizer
    from pipeline.pretrain.flops import training_flops_per_token

    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "DS_ACCELERATOR": "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = a.corpus or (str(SHARED_CORPUS) if SHARED_CORPUS.exists() else None)
        source, texts, corpus = sample_corpus(source, a.documents, tmp)
        tok = tmp / "tokenizer"
        train_tokenizer(texts, "bpe", 50_265, tok, model_max_length=a.seq_len)
        shards = tmp / "shards"
        run_shard_stage(ShardOptions(inputs=(str(corpus),), tokenizer=str(tok), seq_len=a.seq_len, out=str(shards),
                                     val_fraction=0.01, workers=a.threads, quiet=True))
        vocab = json.loads((shards / "index.json").read_text())["tokenizer"]["vocab_size"]

        ours_steps = ours(shards, tok, a.steps, a.batch, tmp / "ours", env)
        worker = [sys.executable, __file__, "--hf-worker", str(shards), str(tok), str(a.steps), str(a.batch)]
        hf = subprocess.run(worker, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        stamps = json.loads(hf.stdout.strip().splitlines()[-1])["stamps"]
        hf_steps = [b - a_ for a_, b in zip(stamps, stamps[1:], strict=False)]

    tokens = a.batch * a.seq_len
    ours_rate = tokens * len(ours_steps[a.skip:]) / sum(ours_steps[a.skip:])
    hf_counted = hf_steps[a.skip - 1:]
    hf_rate = tokens * len(hf_counted) / sum(hf_counted)
    shape = dict(layers=MODEL["num_hidden_layers"], hidden=MODEL["hidden_size"],
                 intermediate=MODEL["intermediate_size"], seq_len=a.seq_len, vocab=vocab)
    predicted = (training_flops_per_token(**shape, masked_fraction=None)
                 / training_flops_per_token(**shape, masked_fraction=0.15))
    print(f"model: {MODEL}, vocabulary {vocab:,}, seq {a.seq_len}, batch {a.batch}, {a.threads} threads, "
          f"{a.steps} steps ({a.skip} warm-up not counted)\n")
    print("| training step | tokens/s | ms per step | vs HF |")
    print("|---|---|---|---|")
    print(f"| HF Trainer + RobertaForMaskedLM + DataCollatorForLanguageModeling | {hf_rate:,.0f} | "
          f"{1e3 * tokens / hf_rate:.0f} | 1.00 |")
    print(f"| ours (launchers/pretrain.py, DeepSpeed ZeRO 0, sparse head) | {ours_rate:,.0f} | "
          f"{1e3 * tokens / ours_rate:.0f} | **{ours_rate / hf_rate:.2f}** |")
    print(f"\nFLOP model: dense head / sparse head = {predicted:.2f}× the FLOPs per token "
          "(pipeline/pretrain/flops.py); "
          f"measured speed-up {ours_rate / hf_rate:.2f}×")


if __name__ == "__main__":
    main()
