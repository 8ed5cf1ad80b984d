"""Shard-stage throughput against the bare tokenizer and HF's run_mlm recipe, measured in one run (docs/benchmarks.md,
"The data stage", says what each method runs and how it is timed)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness

STUDY = harness.Study(
    "shard_throughput", question="Is the data stage fast?", metric="tokens per second and peak memory of a "
    "whole process; origins' share of the shards' bytes", baseline="the bare Rust tokenizer (the floor) and HF's "
    "run_mlm recipe; with --baseline, another commit's shard.py", arms=("shard.py", "bare encode_batch", "run_mlm"))


def peak_rss_of(cmd: list[str], env: dict | None = None) -> tuple[float, int, str]:
    """Run `cmd`; return (wall seconds, peak RSS of its process tree in bytes, stdout)."""
    import psutil

    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=harness.ROOT)
    peak, stop = 0, threading.Event()

    def sample():
        nonlocal peak
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                peak = max(peak, sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]))
            except psutil.Error:
                pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    return time.perf_counter() - started, peak, out


# ----------------------------------------------------------------------------- the methods (child processes)


def method_bare(corpus: str, tokenizer: str) -> dict:
    from tokenizers import Tokenizer

    from pipeline.data.corpus import CorpusOptions, iter_texts, resolve_inputs

    texts = list(iter_texts(resolve_inputs([corpus]), CorpusOptions()))
    tok = Tokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))
    started, tokens = time.perf_counter(), 0
    for i in range(0, len(texts), 1000):
        tokens += sum(len(e.ids) for e in tok.encode_batch(texts[i: i + 1000], add_special_tokens=False))
    return {"seconds": time.perf_counter() - started, "tokens": tokens, "documents": len(texts)}


def method_run_mlm(corpus_jsonl: str, tokenizer: str, seq_len: int, workers: int, out: str) -> dict:
    # Follows transformers/examples/pytorch/language-modeling/run_mlm.py (line_by_line=False).
    from itertools import chain

    import datasets
    from transformers import AutoTokenizer

    started = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(tokenizer)
    raw = datasets.load_dataset("json", data_files={"train": corpus_jsonl}, split="train")

    def tokenize_function(examples):
        return tok(examples["text"], return_special_tokens_mask=True)

    tokenized = raw.map(tokenize_function, batched=True, num_proc=workers, remove_columns=raw.column_names)

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples}
        total = (len(concatenated["input_ids"]) // seq_len) * seq_len
        return {k: [t[i: i + seq_len] for i in range(0, total, seq_len)] for k, t in concatenated.items()}

    grouped = tokenized.map(group_texts, batched=True, num_proc=workers)
    grouped.save_to_disk(out)
    return {"seconds": time.perf_counter() - started, "sequences": len(grouped)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=None, help="jsonl(.zst) corpus (default: shared IMDB, else embedded)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: train a 32k BPE, untimed)")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--origins-seq-len", type=int, default=128,
                        help="sequence length of the origins share measured for every packing mode")
    parser.add_argument("--baseline", help="another checkout whose shard.py is timed beside this one's")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each shard.py for --baseline")
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--args", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.method:  # child process
        print(json.dumps({"bare": method_bare, "run_mlm": method_run_mlm}[a.method](*json.loads(a.args))))
        return
    with STUDY.record() as rec, tempfile.TemporaryDirectory(prefix="shard-bench-") as work:
        measure(a, rec, Path(work))


def measure(a: argparse.Namespace, rec: harness.BenchmarkRecord, work: Path) -> None:
    py = sys.executable
    # Plain jsonl for the datasets recipe and the 10% slice (untimed preparation).
    corpus, texts, plain = harness.sample_corpus(a.corpus or (harness.IMDB if harness.IMDB.exists() else None), None,
                                                 work)
    tenth = work / "tenth.jsonl"
    tenth.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[: len(texts) // 10]))
    tokenizer = a.tokenizer or str(work / "tokenizer")
    if a.tokenizer is None:
        harness.launch([py, "data_prep/train_tokenizer.py", "--input", plain, "--vocab-size", "32000",
                        "--max-documents", "20000", "--out", tokenizer], quiet=True)
    env = {**os.environ, "HF_DATASETS_CACHE": str(work / "hf-cache"), "HF_HUB_OFFLINE": "1"}
    _, peak, out = peak_rss_of([py, __file__, "--method", "bare", "--args", json.dumps([corpus, tokenizer])])
    bare = json.loads(out)
    tokens, results = bare["tokens"], {"bare encode_batch": (bare["seconds"], peak)}

    def shard_cmd(inputs: str, out: Path, *extra: str, checkout: Path = harness.ROOT) -> list[str]:
        # No validation split, as when the README's figures were measured (hashing is not the point here).
        return [py, str(checkout / "data_prep/shard.py"), "--input", inputs, "--tokenizer", tokenizer,
                "--seq-len", str(a.seq_len), "--workers", str(a.workers), "--val-fraction", "0", "--quiet",
                "--out", str(out), *extra]

    results["shard.py (end to end)"] = peak_rss_of(shard_cmd(corpus, work / "shards"))[:2]
    index = json.loads((work / "shards" / "index.json").read_text())
    if index["totals"]["document_tokens"] != tokens:
        raise SystemExit("shard.py and the bare tokenizer disagree on the corpus's tokens")
    t_mlm, peak_mlm, _ = peak_rss_of([py, __file__, "--method", "run_mlm", "--args", json.dumps(
        [str(plain), tokenizer, a.seq_len, a.workers, str(work / "run_mlm")])], env=env)
    results["run_mlm recipe (end to end)"] = (t_mlm, peak_mlm)
    t10, peak10 = peak_rss_of(shard_cmd(str(tenth), work / "tenth"))[:2]
    rec.table(f"{Path(corpus).name}: {len(texts):,} documents ({tokens / 1e6:.1f}M tokens), seq {a.seq_len}, "
              f"{a.workers} workers",
              [{"method": name, "seconds": f"{seconds:.1f}", "Mtok/s": f"{tokens / seconds / 1e6:.2f}",
                "vs bare": f"{bare['seconds'] / seconds:.2f}", "peak memory": f"{peak / 2**20:,.0f} MB"}
               for name, (seconds, peak) in results.items()])
    shard_s = results["shard.py (end to end)"][0]
    rec.headline("shard.py ÷ bare tokenizer", f"{bare['seconds'] / shard_s:.2f}x", target="≥ 0.85x",
                 met=bare["seconds"] / shard_s >= 0.85)
    rec.headline("shard.py ÷ run_mlm recipe (whole processes)", f"{t_mlm / shard_s:.2f}x", target="≥ 1.5x",
                 met=t_mlm / shard_s >= 1.5)
    shard_bytes = sum(s["bytes"] for split in index["splits"].values() for s in split["shards"])
    rec.headline("bytes per token on disk", f"{shard_bytes / index['totals']['tokens']:.2f}")
    rec.headline("shard.py peak memory, a tenth of the corpus vs all of it",
                 f"{peak10 / 2**20:,.0f} MB vs {results['shard.py (end to end)'][1] / 2**20:,.0f} MB")
    measure_origins(a, rec, corpus, work, shard_cmd, index)
    if a.baseline:
        compare_with_baseline(a, rec, corpus, work, shard_cmd)


def origins_share(index: dict) -> tuple[int, int]:
    """(shard bytes, origins bytes) of a shard folder's index."""
    shards = [s for split in index["splits"].values() for s in split["shards"]]
    return sum(s["bytes"] for s in shards), sum(s["origins"]["bytes"] for s in shards)


def measure_origins(a: argparse.Namespace, rec: harness.BenchmarkRecord, corpus: str, work: Path, shard_cmd,
                    index: dict) -> None:
    """Origins bytes ÷ shard bytes: of the main run, and of every packing mode at --origins-seq-len."""
    from pipeline.data.packers import PACKERS

    shard_bytes, origin_bytes = origins_share(index)
    rows, worst = [], 0.0
    for mode in PACKERS:
        out = work / f"origins-{mode}"
        cmd = shard_cmd(corpus, out, "--pack", mode)
        cmd[cmd.index("--seq-len") + 1] = str(a.origins_seq_len)
        harness.launch(cmd)
        mode_index = json.loads((out / "index.json").read_text())
        shards_b, origins_b = origins_share(mode_index)
        worst = max(worst, share := origins_b / shards_b)
        rows.append({"packing": mode, "sequences": f"{mode_index['totals']['sequences']:,}",
                     "documents": f"{mode_index['totals']['documents']:,}", "shards MiB": f"{shards_b / 2**20:.1f}",
                     "origins KiB": f"{origins_b / 2**10:.1f}", "origins ÷ shards": f"{100 * share:.2f}%"})
        shutil.rmtree(out)
    rec.table(f"document origins beside the shards, each packing mode, seq {a.origins_seq_len}", rows)
    rec.headline(f"document origins ÷ shard bytes (seq {a.seq_len}, full)", f"{100 * origin_bytes / shard_bytes:.2f}%",
                 target="≤ 2%", met=origin_bytes / shard_bytes <= 0.02)
    rec.headline(f"document origins ÷ shard bytes, worst packing mode (seq {a.origins_seq_len})",
                 f"{100 * worst:.2f}%", target="≤ 2%", met=worst <= 0.02)


def compare_with_baseline(a: argparse.Namespace, rec: harness.BenchmarkRecord, corpus: str, work: Path,
                          shard_cmd) -> None:
    """This checkout's shard.py against the baseline checkout's, run alternately (the shared cores' load drifts)."""
    baseline = Path(a.baseline).resolve()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=baseline, capture_output=True,
                            text=True).stdout.strip() or baseline.name
    times: dict[str, list[float]] = {"this checkout": [], f"baseline {commit}": []}
    for i in range(a.repeats):
        for seconds, checkout in zip(times.values(), (harness.ROOT, baseline), strict=True):
            out = work / f"repeat-{i}-{checkout.name}"
            seconds.append(peak_rss_of(shard_cmd(corpus, out, checkout=checkout))[0])
            shutil.rmtree(out)
    medians = {name: statistics.median(seconds) for name, seconds in times.items()}
    mine, base = medians.values()
    rec.table(f"shard.py beside the baseline, run alternately, {a.repeats} runs each (whole processes)",
              [{"shard.py of": name, "seconds, each run": ", ".join(f"{t:.1f}" for t in times[name]),
                "median s": f"{medians[name]:.1f}"} for name in times])
    rec.headline(f"shard.py time ÷ baseline {commit}'s (medians of {a.repeats})", f"{mine / base:.3f}x",
                 target="≤ 1.05x", met=mine / base <= 1.05)


if __name__ == "__main__":
    main()
