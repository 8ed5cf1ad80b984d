"""Shard-stage throughput against the bare tokenizer and HF's run_mlm recipe, measured in one run.

    python benchmarks/shard_throughput.py [--corpus FILE] [--tokenizer DIR] [--seq-len 512] [--baseline CHECKOUT]

Same corpus, tokenizer and cores for the three methods:
- bare:    `tokenizers.Tokenizer.encode_batch` over texts already in memory (all cores; the floor);
- shard:   `data_prep/shard.py` end to end, as a user runs it (reading, tokenizing, packing,
           zstd, checksums, index; interpreter start-up included);
- run_mlm: the HF recipe: `datasets` load → `map(tokenize, batched=True)` → `map(group_texts)` →
           `save_to_disk`, with num_proc = cores.
Rates use the same token count for all three (the corpus tokenized without special tokens).
shard.py and run_mlm are timed the same way: the wall clock of a whole process, start-up and
imports included; their in-process times (after imports) are printed too. Each method runs in
its own process, whose peak memory (the whole process tree) is sampled.
Then shard.py runs again on a tenth of the corpus, to show whether peak memory grows with it.

Document origins (which documents each sequence holds, stored beside each shard): their bytes as a
share of the shards' bytes, for the main run and for every packing mode at `--origins-seq-len`
(shorter sequences hold fewer tokens per document listed, so 128 is the harder case). With
`--baseline CHECKOUT` (another commit's checkout, e.g. one made before origins existed), that
checkout's shard.py and this one's run alternately, `--repeats` times each, on the same corpus and
settings; the ratio of their median whole-process times says what the change costs.

Default corpus: ../shared/data/corpus/imdb-reviews.jsonl.zst when present, else the embedded one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from result_record import BenchmarkRecord  # noqa: E402

SHARED_CORPUS = ROOT.parent / "shared" / "data" / "corpus" / "imdb-reviews.jsonl.zst"


def peak_rss_of(cmd: list[str], env: dict | None = None) -> tuple[float, int, str]:
    """Run `cmd`; return (wall seconds, peak RSS of its process tree in bytes, stdout)."""
    import psutil

    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    peak = 0
    stop = threading.Event()

    def sample():
        nonlocal peak
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
                peak = max(peak, rss)
            except psutil.Error:
                pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    stop.set()
    sampler.join()
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    return seconds, peak, out


# ----------------------------------------------------------------------------- the methods (child processes)


def method_bare(corpus: str, tokenizer: str) -> dict:
    from tokenizers import Tokenizer

    from pipeline.data.corpus import CorpusOptions, iter_texts, resolve_inputs

    texts = list(iter_texts(resolve_inputs([corpus]), CorpusOptions()))
    tok = Tokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))
    started = time.perf_counter()
    tokens = 0
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


# ----------------------------------------------------------------------------- driver


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
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--args", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.method:  # child process
        fn = {"bare": method_bare, "run_mlm": method_run_mlm}[a.method]
        print(json.dumps(fn(*json.loads(a.args))))
        return
    with BenchmarkRecord("shard_throughput", argv=sys.argv) as rec:
        measure(a, rec)


def measure(a: argparse.Namespace, rec: BenchmarkRecord) -> None:
    work = Path(tempfile.mkdtemp(prefix="shard-bench-"))
    py = sys.executable
    try:
        corpus = a.corpus or (str(SHARED_CORPUS) if SHARED_CORPUS.exists() else None)
        if corpus is None:
            corpus = str(work / "embedded.jsonl")
            subprocess.run([py, "data_prep/make_default_corpus.py", "--out", corpus], cwd=ROOT, check=True)
        # Plain jsonl for the datasets recipe and the 10% slice (untimed preparation).
        from pipeline.data.corpus import CorpusOptions, iter_texts, resolve_inputs

        texts = list(iter_texts(resolve_inputs([corpus]), CorpusOptions()))
        plain, tenth = work / "corpus.jsonl", work / "tenth.jsonl"
        plain.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        tenth.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[: len(texts) // 10]))
        tokenizer = a.tokenizer
        if tokenizer is None:
            tokenizer = str(work / "tokenizer")
            subprocess.run([py, "data_prep/train_tokenizer.py", "--input", str(plain), "--vocab-size", "32000",
                            "--max-documents", "20000", "--out", tokenizer], cwd=ROOT, check=True,
                           capture_output=True)
        print(f"corpus {corpus}: {len(texts):,} documents; tokenizer {tokenizer}; {a.workers} workers; "
              f"seq_len {a.seq_len}", flush=True)

        env = {**os.environ, "HF_DATASETS_CACHE": str(work / "hf-cache"), "HF_HUB_OFFLINE": "1"}
        results = {}
        t, peak, out = peak_rss_of([py, __file__, "--method", "bare", "--args", json.dumps([corpus, tokenizer])])
        bare = json.loads(out)
        tokens = bare["tokens"]
        results["bare encode_batch"] = (bare["seconds"], peak)

        def shard_cmd(inputs: str, out: Path, *extra: str, checkout: Path = ROOT) -> list[str]:
            # No validation split, as when the README's figures were measured (hashing is not the point here).
            return [py, str(checkout / "data_prep/shard.py"), "--input", inputs, "--tokenizer", tokenizer,
                    "--seq-len", str(a.seq_len), "--workers", str(a.workers), "--val-fraction", "0", "--quiet",
                    "--out", str(out), *extra]

        t, peak = peak_rss_of(shard_cmd(corpus, work / "shards"))[:2]
        results["shard.py (end to end)"] = (t, peak)
        index = json.loads((work / "shards" / "index.json").read_text())
        assert index["totals"]["document_tokens"] == tokens, "shard.py and the bare tokenizer disagree on tokens"

        t_mlm, peak_mlm, out = peak_rss_of([py, __file__, "--method", "run_mlm", "--args",
                                            json.dumps([str(plain), tokenizer, a.seq_len, a.workers,
                                                        str(work / "run_mlm")])], env=env)
        mlm_inside = json.loads(out)["seconds"]
        results["run_mlm recipe (end to end)"] = (t_mlm, peak_mlm)

        t10, peak10 = peak_rss_of(shard_cmd(str(tenth), work / "tenth"))[:2]

        shard_bytes = sum(s["bytes"] for split in index["splits"].values() for s in split["shards"])
        print(f"\n{'method':<30}{'seconds':>9}{'Mtok/s':>9}{'vs bare':>9}{'peak MB':>9}")
        rows = []
        for name, (seconds, peak) in results.items():
            rate = tokens / seconds
            print(f"{name:<30}{seconds:>9.2f}{rate / 1e6:>9.3f}{bare['seconds'] / seconds:>9.2f}{peak / 2**20:>9.0f}")
            rows.append({"method": name, "seconds": f"{seconds:.1f}", "Mtok/s": f"{rate / 1e6:.2f}",
                         "vs bare": f"{bare['seconds'] / seconds:.2f}", "peak memory": f"{peak / 2**20:,.0f} MB"})
        rec.table(f"{Path(corpus).name}: {len(texts):,} documents ({tokens / 1e6:.1f}M tokens), seq {a.seq_len}, "
                  f"{a.workers} workers", rows)
        shard_s, mlm_s = results["shard.py (end to end)"][0], t_mlm
        stage_s = index["parts"][0]["seconds"]
        print(f"\nshard.py / bare tokenizer     {bare['seconds'] / shard_s:.2f}x   (target >= 0.85x)")
        print(f"shard.py / run_mlm recipe     {mlm_s / shard_s:.2f}x   (target >= 1.5x; both whole processes)")
        print(f"after imports: shard stage {stage_s:.2f} s, run_mlm {mlm_inside:.2f} s -> "
              f"{mlm_inside / stage_s:.2f}x; shard stage / bare {bare['seconds'] / stage_s:.2f}x, "
              f"run_mlm / bare {bare['seconds'] / mlm_inside:.2f}x")
        print(f"bytes per token on disk       {shard_bytes / index['totals']['tokens']:.3f} "
              f"({shard_bytes / 2**20:.1f} MiB for {index['totals']['tokens']:,} tokens, {index['dtype']})")
        rec.headline("shard.py ÷ bare tokenizer", f"{bare['seconds'] / shard_s:.2f}x", target="≥ 0.85x",
                     met=bare["seconds"] / shard_s >= 0.85)
        rec.headline("shard.py ÷ run_mlm recipe (whole processes)", f"{mlm_s / shard_s:.2f}x", target="≥ 1.5x",
                     met=mlm_s / shard_s >= 1.5)
        rec.headline("bytes per token on disk", f"{shard_bytes / index['totals']['tokens']:.2f}")
        peak_all = results["shard.py (end to end)"][1]
        print(f"peak memory, 10% vs 100%      {peak10 / 2**20:.0f} MB vs {peak_all / 2**20:.0f} MB "
              f"(ratio {peak_all / peak10:.2f} for 10x the corpus; {t10:.1f} s vs {shard_s:.1f} s)")
        rec.headline("shard.py peak memory, a tenth of the corpus vs all of it",
                     f"{peak10 / 2**20:,.0f} MB vs {peak_all / 2**20:,.0f} MB")
        measure_origins(a, rec, corpus, work, shard_cmd, index)
        if a.baseline:
            compare_with_baseline(a, rec, corpus, work, shard_cmd)
    finally:
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def origins_share(index: dict) -> tuple[int, int]:
    """(shard bytes, origins bytes) of a shard folder's index."""
    shards = [s for split in index["splits"].values() for s in split["shards"]]
    return sum(s["bytes"] for s in shards), sum(s["origins"]["bytes"] for s in shards)


def measure_origins(a: argparse.Namespace, rec: BenchmarkRecord, corpus: str, work: Path, shard_cmd,
                    index: dict) -> None:
    """Origins bytes ÷ shard bytes: of the main run, and of every packing mode at --origins-seq-len."""
    from pipeline.data.packers import PACKERS

    shard_bytes, origin_bytes = origins_share(index)
    print(f"document origins              {origin_bytes / 2**10:,.1f} KiB, {100 * origin_bytes / shard_bytes:.3f}% "
          f"of the shards' {shard_bytes / 2**20:,.1f} MiB")
    rows, worst = [], 0.0
    for mode in PACKERS:
        out = work / f"origins-{mode}"
        cmd = shard_cmd(corpus, out, "--pack", mode)
        cmd[cmd.index("--seq-len") + 1] = str(a.origins_seq_len)
        subprocess.run(cmd, cwd=ROOT, check=True)
        mode_index = json.loads((out / "index.json").read_text())
        shards_b, origins_b = origins_share(mode_index)
        share = origins_b / shards_b
        worst = max(worst, share)
        rows.append({"packing": mode, "sequences": f"{mode_index['totals']['sequences']:,}",
                     "documents": f"{mode_index['totals']['documents']:,}", "shards MiB": f"{shards_b / 2**20:.1f}",
                     "origins KiB": f"{origins_b / 2**10:.1f}", "origins ÷ shards": f"{100 * share:.2f}%"})
        print(f"  {mode:<12} origins {origins_b / 2**10:9,.1f} KiB = {100 * share:.2f}% of the shards")
        shutil.rmtree(out)
    rec.table(f"document origins beside the shards, each packing mode, seq {a.origins_seq_len}", rows)
    rec.headline(f"document origins ÷ shard bytes (seq {a.seq_len}, full)", f"{100 * origin_bytes / shard_bytes:.2f}%",
                 target="≤ 2%", met=origin_bytes / shard_bytes <= 0.02)
    rec.headline(f"document origins ÷ shard bytes, worst packing mode (seq {a.origins_seq_len})",
                 f"{100 * worst:.2f}%", target="≤ 2%", met=worst <= 0.02)


def compare_with_baseline(a: argparse.Namespace, rec: BenchmarkRecord, corpus: str, work: Path, shard_cmd) -> None:
    """This checkout's shard.py against the baseline checkout's, run alternately (the shared cores' load drifts)."""
    import statistics

    baseline = Path(a.baseline).resolve()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=baseline, capture_output=True,
                            text=True).stdout.strip() or baseline.name
    times: dict[str, list[float]] = {"this checkout": [], f"baseline {commit}": []}
    for i in range(a.repeats):
        for (name, seconds), checkout in zip(times.items(), (ROOT, baseline), strict=True):
            out = work / f"repeat-{i}-{checkout.name}"
            seconds.append(peak_rss_of(shard_cmd(corpus, out, checkout=checkout))[0])
            shutil.rmtree(out)
            print(f"  {name:<22} run {i + 1}: {seconds[-1]:.1f} s", flush=True)
    medians = {name: statistics.median(seconds) for name, seconds in times.items()}
    mine, base = medians.values()
    rec.table(f"shard.py beside the baseline, run alternately, {a.repeats} runs each (whole processes)",
              [{"shard.py of": name, "seconds, each run": ", ".join(f"{t:.1f}" for t in times[name]),
                "median s": f"{medians[name]:.1f}"} for name in times])
    print(f"shard.py / baseline            {mine / base:.3f}x the time (medians)")
    rec.headline(f"shard.py time ÷ baseline {commit}'s (medians of {a.repeats})", f"{mine / base:.3f}x",
                 target="≤ 1.05x", met=mine / base <= 1.05)


if __name__ == "__main__":
    main()
