"""Real-text throughput of the packing modes: `doc-packed` against `doc` (padded) and `full`, in one run.

    python benchmarks/packing_throughput.py [--corpus FILE] [--documents 4000] [--seq-len 512] [--steps 12]

A corpus of short documents (default: ../shared/data/corpus/imdb-reviews.jsonl.zst, else BBC news,
else the embedded corpus) is sharded three ways with the same tokenizer; each shard folder is then
trained on by `python launchers/pretrain.py` as a user runs it (the 4-layer, hidden-256 benchmark
model, fp32, ZeRO 0, one process, the same threads), twice in alternating order. Reported per mode:
the padding fraction of its shards, tokens of real text per second (padding excluded, from
metrics.jsonl), and the time per real token; the headline is doc-packed ÷ doc.

`full` packs densely too but lets attention cross documents; `doc-packed` keeps each document to
itself (pipeline/pretrain/packed_attention.py), so it is the one to compare with `doc`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from result_record import BenchmarkRecord  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
CORPORA = [SHARED / "corpus" / "imdb-reviews.jsonl.zst", SHARED / "tasks" / "bbc_news.jsonl"]
MODEL = dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
MODES = ("doc", "doc-packed", "full")


def train_run(shards: Path, tokenizer: Path, out: Path, steps: int, batch: int, env: dict) -> tuple[float, float]:
    """Train `steps` steps; return (real tokens, seconds) over the steps after the first third."""
    config = {
        "model": MODEL, "data": {"shards": str(shards), "tokenizer": str(tokenizer), "num_workers": 0},
        "optimizer": {"lr": 5e-4}, "schedule": {"warmup_steps": 2},
        "train": {"output_dir": str(out), "max_steps": steps, "global_batch_size": batch, "micro_batch_size": batch,
                  "eval_sequences": batch, "export": False},
        "checkpoint": {"every": 10**6}, "tracking": {"enabled": False},
    }
    path = out.with_suffix(".json")
    path.write_text(json.dumps(config))
    subprocess.run([sys.executable, "launchers/pretrain.py", "--config", str(path)], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in records if "train/loss" in r][steps // 3:]
    seconds = [batch / r["train/samples_per_s"] for r in steps_]
    tokens = [r["train/tokens_per_s"] * s for r, s in zip(steps_, seconds, strict=True)]
    return sum(tokens), sum(seconds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default=None)
    p.add_argument("--documents", type=int, default=4000)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=2, help="each mode trained this many times, order alternating")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = p.parse_args()
    with BenchmarkRecord("packing_throughput", argv=sys.argv) as rec:
        measure(a, rec)


def measure(a: argparse.Namespace, rec: BenchmarkRecord) -> None:
    from bench_corpus import sample_corpus

    from pipeline.data.shard_options import ShardOptions
    from pipeline.data.shard_stage import run_shard_stage
    from pipeline.data.tokenizer import train_tokenizer

    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "DS_ACCELERATOR": "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = a.corpus or next((str(c) for c in CORPORA if c.exists()), None)
        source, texts, corpus = sample_corpus(source, a.documents, tmp)
        tok = tmp / "tokenizer"
        train_tokenizer(texts, "bpe", 16_000, tok, model_max_length=a.seq_len)
        padding, stats = {}, {m: ([], []) for m in MODES}
        for mode in MODES:
            out = tmp / f"shards-{mode}"
            run_shard_stage(ShardOptions(inputs=(str(corpus),), tokenizer=str(tok), seq_len=a.seq_len, out=str(out),
                                      pack=mode, val_fraction=0.02, workers=a.threads, quiet=True))
            padding[mode] = json.loads((out / "index.json").read_text())["totals"]["padding_fraction"]
        for round_ in range(a.rounds):
            for mode in (MODES if round_ % 2 == 0 else MODES[::-1]):
                tokens, seconds = train_run(tmp / f"shards-{mode}", tok, tmp / f"run-{mode}-{round_}", a.steps,
                                            a.batch, env)
                stats[mode][0].append(tokens / seconds)
                stats[mode][1].append(seconds / tokens)

    rate = {m: statistics.median(stats[m][0]) for m in MODES}
    print(f"corpus {Path(source).name}: {len(texts):,} documents, seq_len {a.seq_len}, batch {a.batch}, "
          f"model {MODEL}, fp32, {a.threads} threads, {a.steps} steps × {a.rounds} rounds per mode\n")
    print("| packing | padding | real tokens/s | µs per real token | vs doc |")
    print("|---|---|---|---|---|")
    for mode in MODES:
        print(f"| `{mode}` | {padding[mode]:.1%} | {rate[mode]:,.0f} | {1e6 / rate[mode]:.0f} | "
              f"**{rate[mode] / rate['doc']:.2f}** |")
    print(f"\ndoc-packed / doc real-token throughput: {rate['doc-packed'] / rate['doc']:.2f}× (target ≥ 1.4×)")
    rec.table(f"{len(texts):,} documents of {Path(source).name}, seq_len {a.seq_len}, batch {a.batch}, 4 layers, "
              f"hidden 256, fp32, {a.threads} threads, {a.steps} steps × {a.rounds} rounds per mode",
              [{"packing": f"`{mode}`", "padding": f"{padding[mode]:.1%}", "real tokens/s": f"{rate[mode]:,.0f}",
                "µs per real token": f"{1e6 / rate[mode]:,.0f}", "vs `doc`": f"{rate[mode] / rate['doc']:.2f}"}
               for mode in MODES])
    ratio = rate["doc-packed"] / rate["doc"]
    rec.headline("doc-packed ÷ doc real-token throughput", f"{ratio:.2f}", target="≥ 1.4", met=ratio >= 1.4)


if __name__ == "__main__":
    main()
