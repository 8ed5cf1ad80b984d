"""Training throughput and MFU: our pretraining step, option by option, against HF Trainer, in one run.

    python benchmarks/train_throughput.py [--corpus FILE] [--steps 20] [--batch 32] [--seq-len 128]
                                          [--variants baseline,fused,compile,loader,syncs,all]

Same model (4 layers, hidden 256, 4 heads, FFN 1024, a 50,265-token BPE vocabulary trained here,
seq 128, dropout 0.1), same packed sequences, same batch, AdamW with the same settings, fp32,
one process with the same threads:
- ours: `python launchers/pretrain.py` as a user runs it (DeepSpeed engine, ZeRO 0, the hashed
  masking collator, the sparse MLM head), once per variant; step times from its metrics.jsonl.
  baseline: the loader in the training process, torch's per-tensor AdamW, eager model, logging
  (losses to the host) every step. Each other variant changes one thing: `optimizer.fused`,
  `train.compile`, `data.num_workers 1`, `train.log_every 5` (the losses reach the host every 5
  steps instead of every step); `all` changes all four.
- HF:   `transformers.Trainer` on `RobertaForMaskedLM` with `DataCollatorForLanguageModeling`
  (its defaults: fused AdamW on torch ≥ 2.8, data in the training process), step times from a callback.
The first `--skip` steps of each are warm-up (and compilation) and not counted.

Peak: a 4096 × 4096 fp32 `torch.mm` with the same threads, best of 5, measured before every
training run of this benchmark; the best of those is the peak (the most the cores gave in this run).

MFU convention (PaLM's: the FLOPs the model's math needs, not what a kernel recomputes), from the
FLOP model in pipeline/pretrain/flops.py: for ours the MLM head counts at the masked fraction
(the sparse head only computes those rows), for HF at every position (its head computes all
logits). "dense-equivalent" counts the dense head for both: the same FLOPs per token, so its ratio
is the tokens/s speed-up; above 100% for ours, it measures the saving of the sparse head, not
utilisation.

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
from matmul_peak import peak_flops  # noqa: E402
from result_record import BenchmarkRecord  # noqa: E402

SHARED_CORPUS = ROOT.parent / "shared" / "data" / "corpus" / "imdb-reviews.jsonl.zst"
MODEL = dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
MASKED = 0.15  # masking.probability (the default)
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


VARIANTS = {  # name: (what changes, config updates by section)
    "baseline": ("eager, per-tensor AdamW, loader in process, losses to host every step", {}),
    "fused": ("+ optimizer.fused (torch's fused AdamW)", {"optimizer": {"fused": True}}),
    "compile": ("+ train.compile (engine.compile, inductor)", {"train": {"compile": True}}),
    "loader": ("+ data.num_workers 1 (masking in a worker process)", {"data": {"num_workers": 1}}),
    "syncs": ("+ train.log_every 5 (losses to host every 5 steps)", {"train": {"log_every": 5}}),
    "all": ("all of the above", {"optimizer": {"fused": True}, "train": {"compile": True, "log_every": 5},
                                 "data": {"num_workers": 1}}),
}


def ours(shards: Path, tokenizer_dir: Path, steps: int, batch: int, skip: int, out: Path, env: dict,
         updates: dict, timeout: float | None = None) -> tuple[float, float]:
    """Run launchers/pretrain.py (killed after `timeout` seconds); (seconds per counted step, masked fraction)
    from its metrics.jsonl."""
    config = {
        "model": MODEL, "data": {"shards": str(shards), "tokenizer": str(tokenizer_dir), "num_workers": 0,
                                 "cache_dir": str(out.parent / "token_cache")},
        "optimizer": OPTIMIZER, "schedule": {"warmup_steps": 2},
        "train": {"output_dir": str(out), "max_steps": steps, "global_batch_size": batch, "micro_batch_size": batch,
                  "eval_sequences": batch, "export": False, "log_every": 1},
        "checkpoint": {"every": 10**6}, "tracking": {"enabled": False},
    }
    for section, values in updates.items():
        config[section] = {**config[section], **values}
    path = out.parent / f"{out.name}.json"
    path.write_text(json.dumps(config))
    done = subprocess.run([sys.executable, "launchers/pretrain.py", "--config", str(path)], cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=None if timeout is None else max(1.0, timeout))
    if done.returncode != 0:  # the run's own last words, for whoever records the failure
        raise RuntimeError(f"launchers/pretrain.py exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "train/loss" in r]
    seconds, counted, previous = 0.0, 0, 0
    for r in records:  # a record covers the steps since the previous one
        if previous >= skip:
            seconds += (r["step"] - previous) * batch / r["train/samples_per_s"]
            counted += r["step"] - previous
        previous = r["step"]
    return seconds / counted, MASKED  # the FLOP model's masked fraction, as the trainer's MFU uses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default=None, help="jsonl(.zst) corpus (default: shared IMDB, else embedded)")
    p.add_argument("--documents", type=int, default=20_000, help="documents used to train the tokenizer and shard")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--skip", type=int, default=5, help="warm-up steps not counted (a multiple of 5)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--no-hf", action="store_true", help="skip the HF Trainer run")
    p.add_argument("--hf-worker", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.hf_worker:
        shards, tok, steps, batch = a.hf_worker
        return hf_worker(shards, tok, int(steps), int(batch))
    variants = a.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or a.skip % 5 or a.skip >= a.steps:
        p.error(f"unknown variants {unknown}" if unknown else "--skip must be a multiple of 5 and below --steps")
    with BenchmarkRecord("train_throughput", argv=sys.argv) as rec:
        measure(a, variants, rec)


def measure(a: argparse.Namespace, variants: list[str], rec: BenchmarkRecord) -> None:
    from bench_corpus import sample_corpus

    from pipeline.data.shard_options import ShardOptions
    from pipeline.data.shard_stage import run_shard_stage
    from pipeline.data.tokenizer import train_tokenizer
    from pipeline.pretrain.flops import training_flops_per_token

    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "DS_ACCELERATOR": "cpu"}
    peaks, rows = [], {}
    started = time.perf_counter()
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

        for name in variants:
            peaks.append(peak_flops(a.threads))
            rows[name] = ours(shards, tok, a.steps, a.batch, a.skip, tmp / name, env, VARIANTS[name][1])
        if not a.no_hf:
            peaks.append(peak_flops(a.threads))
            worker = [sys.executable, __file__, "--hf-worker", str(shards), str(tok), str(a.steps), str(a.batch)]
            hf = subprocess.run(worker, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
            stamps = json.loads(hf.stdout.strip().splitlines()[-1])["stamps"]
            counted = [b - a_ for a_, b in zip(stamps, stamps[1:], strict=False)][a.skip - 1:]
            rows["hf"] = (sum(counted) / len(counted), None)
        peaks.append(peak_flops(a.threads))

    peak = max(peaks)
    shape = dict(layers=MODEL["num_hidden_layers"], hidden=MODEL["hidden_size"],
                 intermediate=MODEL["intermediate_size"], seq_len=a.seq_len, vocab=vocab)
    dense = training_flops_per_token(**shape, masked_fraction=None)
    tokens = a.batch * a.seq_len
    hf_seconds = rows["hf"][0] if "hf" in rows else None
    print(f"model: {MODEL}, vocabulary {vocab:,}, seq {a.seq_len}, batch {a.batch}, fp32, {a.threads} threads, "
          f"{a.steps} steps ({a.skip} warm-up not counted)")
    print(f"peak: {peak / 1e9:.1f} GFLOP/s (4096² fp32 torch.mm, best of 5, {len(peaks)} times in this run: "
          f"{', '.join(f'{x / 1e9:.0f}' for x in peaks)}); FLOPs per token: dense head {dense / 1e6:.1f} M\n")
    print("| training step | ms per step | tokens/s | model GFLOP/s | MFU | dense-equivalent / peak | vs HF |")
    print("|---|---|---|---|---|---|---|")
    table = []
    for name, (seconds, masked) in rows.items():
        per_token = dense if masked is None else training_flops_per_token(**shape, masked_fraction=masked)
        label = ("HF Trainer + RobertaForMaskedLM + DataCollatorForLanguageModeling" if name == "hf"
                 else f"ours, {name}: {VARIANTS[name][0]}")
        flops = tokens * per_token / seconds
        speedup = f"{hf_seconds / seconds:.2f}" if hf_seconds else "–"
        print(f"| {label} | {1e3 * seconds:,.0f} | {tokens / seconds:,.0f} | {flops / 1e9:.1f} | "
              f"**{flops / peak:.0%}** | {tokens * dense / seconds / peak:.0%} | {speedup} |")
        table.append({"training step": label, "ms per step": f"{1e3 * seconds:,.0f}",
                      "tokens/s": f"{tokens / seconds:,.0f}", "model GFLOP/s": f"{flops / 1e9:.1f}",
                      "MFU": f"{flops / peak:.0%}", "dense-equivalent / peak": f"{tokens * dense / seconds / peak:.0%}",
                      "vs HF": speedup})
    rec.table(f"4 layers, hidden 256, vocabulary {vocab:,}, seq {a.seq_len}, batch {a.batch}, fp32, {a.threads} "
              f"threads, {a.steps} steps ({a.skip} warm-up not counted); peak {peak / 1e9:.1f} GFLOP/s", table)
    if hf_seconds and "baseline" in rows:
        rec.headline("ours (baseline) vs HF Trainer", f"{hf_seconds / rows['baseline'][0]:.2f}×")
    print(f"\nwall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
