"""Mixing two real corpora in pretraining: realised proportions and per-corpus validation loss.

    python benchmarks/corpus_mix.py [--mixes 0.7:0.3,0.3:0.7] [--steps 120] [--reviews 10000] [--out DIR]

Every stage runs through the user-facing commands:
1. IMDB reviews (the first `--reviews` of ../shared/data/corpus/imdb-reviews.jsonl.zst) and
   WikiText-2 (its validation and test files; paragraphs are documents);
2. one 8k byte-level BPE tokenizer trained on both, and 128-token shards of each corpus;
3. for each mix `imdb:wikitext`, `--steps` steps of 32 sequences of configs/tiny.json (2 layers,
   hidden 128) in one process, with `data.shards` the weighted list;
4. the table: the realised share of each corpus in the sequences trained on (counted from the
   run's own step → sequence order, and from its logged `data/<name>/epoch`), and each corpus's
   validation MLM loss (`eval/<name>/mlm_loss`) next to the overall one.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "corpus"
sys.path.insert(0, str(ROOT))
from result_record import BenchmarkRecord  # noqa: E402


def run(*cmd, env=None) -> None:
    print("$", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=ROOT, env=env, check=True)


def write_reviews(source: Path, target: Path, count: int) -> None:
    import zstandard

    with open(source, "rb") as raw, open(target, "w", encoding="utf-8") as out:
        reader = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(raw), encoding="utf-8")
        for n, line in enumerate(reader):
            if n == count:
                break
            out.write(line)


def realised_shares(run_dir: Path, sizes: list[int], weights: list[float], steps: int) -> list[float]:
    """Each corpus's share of the sequences the run trained on, counted from its step → sequence order."""
    import numpy as np

    from pipeline.pretrain.batch_plan import BatchPlan
    from pipeline.pretrain.stream import DataStream, shares_of

    config = json.loads((run_dir / "config.json").read_text())
    plan = BatchPlan.derive(config["train"]["global_batch_size"], config["train"]["micro_batch_size"], 1)
    stream = DataStream(sizes, plan, config["train"]["seed"], shares=shares_of(weights))
    corpus = np.concatenate([stream.step_sequences(s)[0] for s in range(steps)])
    counts = np.bincount(corpus, minlength=len(sizes))
    return (counts / counts.sum()).tolist()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mixes", default="0.7:0.3,0.3:0.7", help="imdb:wikitext weights, comma-separated runs")
    p.add_argument("--steps", type=int, default=120, help="optimizer steps of 32 sequences per run")
    p.add_argument("--reviews", type=int, default=10_000, help="IMDB reviews used")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "corpus-mix")
    a = p.parse_args()
    imdb, wiki = SHARED / "imdb-reviews.jsonl.zst", SHARED / "wikitext2"
    if not imdb.exists() or not wiki.is_dir():
        raise SystemExit(f"needs {imdb} and {wiki}")
    with BenchmarkRecord("corpus_mix", argv=sys.argv) as rec:
        measure(a, imdb, wiki, rec)


def measure(a: argparse.Namespace, imdb: Path, wiki: Path, rec: BenchmarkRecord) -> None:
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    if not (out / "imdb.jsonl").exists():
        write_reviews(imdb, out / "imdb.jsonl", a.reviews)
    inputs = {"imdb": [out / "imdb.jsonl"], "wikitext": [wiki / "valid.txt", wiki / "test.txt"]}
    if not (out / "tokenizer" / "tokenizer.json").exists():
        run(py, "data_prep/train_tokenizer.py", "--input", *inputs["imdb"], *inputs["wikitext"], "--type", "bpe",
            "--vocab-size", 8000, "--model-max-length", 128, "--out", out / "tokenizer")
    for name, files in inputs.items():
        run(py, "data_prep/shard.py", "--input", *files, "--tokenizer", out / "tokenizer", "--seq-len", 128,
            "--val-fraction", "0.05", "--out", out / "shards" / name, "--quiet")
    from pipeline.data.shard_index import load_index

    sizes = [load_index(out / "shards" / n)["splits"]["train"]["sequences"] for n in inputs]
    rows = []
    for mix in a.mixes.split(","):
        weights = [float(w) for w in mix.split(":")]
        blend = [{"path": str(out / "shards" / n), "weight": w} for n, w in zip(inputs, weights, strict=True)]
        run_dir = out / f"pretrain-{mix.replace(':', '-')}"
        started = time.monotonic()
        run(py, "launchers/pretrain.py", "--config", "configs/tiny.json",
            "--set", f"data.shards={json.dumps(blend)}", "--set", f"data.tokenizer={out / 'tokenizer'}",
            "--set", f"data.cache_dir={out / 'token_cache'}", "--set", f"train.output_dir={run_dir}",
            "--set", f"train.max_steps={a.steps}", "--set", f"train.eval_every={max(1, a.steps // 3)}",
            "--set", "train.log_every=10", "--set", f"checkpoint.every={a.steps}", "--set", "train.export=false",
            "--set", f"tracking.uri=sqlite:///{out / 'mlflow.db'}", "--set", "tracking.experiment=corpus-mix",
            "--set", "train.zero_stage=0", env=env)
        seconds = time.monotonic() - started
        records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        last = {k: v for r in records if r.get("step") == a.steps for k, v in r.items()}
        first_eval = next(r for r in records if "eval/mlm_loss" in r)
        counted = realised_shares(run_dir, sizes, weights, a.steps)
        logged = [last[f"data/{n}/epoch"] * size for n, size in zip(inputs, sizes, strict=True)]
        rows.append((mix, counted, [x / sum(logged) for x in logged], first_eval, last, seconds))

    print(f"\ntrain sequences (128 tokens): imdb {sizes[0]:,}, wikitext {sizes[1]:,}; {a.steps} steps × 32 sequences "
          f"= {a.steps * 32:,} per run\n")
    print("| weights imdb:wikitext | realised share imdb / wikitext (counted; logged) | epochs imdb / wikitext "
          f"| eval loss imdb | eval loss wikitext | eval loss overall | first eval (step {rows[0][3]['step']}) "
          "imdb / wikitext | run |")
    print("|---|---|---|---|---|---|---|---|")
    from pipeline.pretrain.plateau import metrics_beside_plateau as plateau  # each loss beside its unigram entropy

    table = []
    for mix, counted, logged, first, last, seconds in rows:
        shares = " / ".join(f"{100 * s:.2f}%" for s in counted) + "; " + " / ".join(f"{100 * s:.2f}%" for s in logged)
        print(f"| {mix} | {shares} | {last['data/imdb/epoch']:.3f} / {last['data/wikitext/epoch']:.3f} "
              f"| {plateau(last, 'eval/imdb/')} | {plateau(last, 'eval/wikitext/')} "
              f"| {plateau(last)} | {first['eval/imdb/mlm_loss']:.3f} / "
              f"{first['eval/wikitext/mlm_loss']:.3f} | {seconds / 60:.1f} min |")
        table.append({"weights imdb:wikitext": mix, "realised share imdb / wikitext (counted; logged)": shares,
                      "epochs imdb / wikitext": f"{last['data/imdb/epoch']:.3f} / {last['data/wikitext/epoch']:.3f}",
                      "eval loss imdb": plateau(last, "eval/imdb/"),
                      "eval loss wikitext": plateau(last, "eval/wikitext/"),
                      "`eval/mlm_loss`": plateau(last), "run": f"{seconds / 60:.1f} min"})
    rec.table(f"{a.reviews:,} IMDB reviews + WikiText-2 (valid + test), 8k BPE, 128-token shards ({sizes[0]:,} and "
              f"{sizes[1]:,} train sequences), configs/tiny.json, {a.steps} steps × 32 sequences, one process", table)


if __name__ == "__main__":
    main()
