"""Exact deduplication: time and memory of `shard.py --dedup exact` against no deduplication, in one run.

    python benchmarks/exact_dedup.py [--corpus FILE] [--duplicate 0.10] [--tokenizer DIR]

The corpus (default: the shared IMDB reviews) gets 10% of its documents again, at random places:
a third verbatim, a third upper-cased, a third with its whitespace changed, all of which the
normalised hash counts as the same text. `shard.py` then runs as one process on all cores, without
and with `--dedup exact`; each run's wall time and peak memory (its whole process tree) are
measured, and the dropped documents are checked against a count made here with the same hash
(IMDB holds a few duplicate reviews of its own, which are dropped too).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_corpus import bench_tokenizer  # noqa: E402
from result_record import BenchmarkRecord  # noqa: E402

SHARED_CORPUS = ROOT.parent / "shared" / "data" / "corpus" / "imdb-reviews.jsonl.zst"


def duplicated_corpus(corpus: Path, fraction: float, out: Path) -> tuple[int, int]:
    """Write the corpus with `fraction` of its documents repeated; return (documents, distinct texts)."""
    import zstandard

    from pipeline.data.exact_dedup import normalised_hash

    with open(corpus, "rb") as fh:
        lines = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True)).read()
    texts = [json.loads(line)["text"] for line in lines.splitlines() if line.strip()]
    rng = random.Random(0)
    variants = [lambda t: t, str.upper, lambda t: "  " + t.replace(" ", " \t ") + "\n"]
    copies = [(rng.randrange(len(texts) + 1), variants[i % 3](text))
              for i, text in enumerate(rng.sample(texts, int(len(texts) * fraction)))]
    docs = list(texts)
    for position, text in sorted(copies, reverse=True):
        docs.insert(position, text)
    out.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    return len(docs), len({normalised_hash(t) for t in docs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=SHARED_CORPUS)
    parser.add_argument("--duplicate", type=float, default=0.10, help="fraction of documents added again")
    parser.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder (default: train 16k BPE)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    a = parser.parse_args()
    if not a.corpus.is_file():
        raise SystemExit(f"{a.corpus}: no such corpus (see ../shared/data/README.md)")
    with BenchmarkRecord("exact_dedup", argv=sys.argv) as rec:
        measure(a, rec)


def measure(a: argparse.Namespace, rec: BenchmarkRecord) -> None:
    from shard_throughput import peak_rss_of

    work = Path(tempfile.mkdtemp(prefix="dedup-bench-"))
    try:
        corpus = work / "corpus.jsonl"
        documents, distinct = duplicated_corpus(a.corpus, a.duplicate, corpus)
        tokenizer = a.tokenizer or bench_tokenizer(a.corpus, work / "tok")
        print(f"{documents:,} documents, {distinct:,} distinct after normalising; {a.workers} workers\n")
        print(f"{'run':<22}{'seconds':>9}{'peak MB':>9}{'documents':>11}{'dropped':>9}{'dropped tokens':>16}")
        seconds, rows = {}, []
        for dedup in ("none", "exact"):
            out = work / f"shards-{dedup}"
            cmd = [sys.executable, "data_prep/shard.py", "--input", str(corpus), "--tokenizer", str(tokenizer),
                   "--seq-len", "512", "--workers", str(a.workers), "--dedup", dedup, "--quiet", "--out", str(out)]
            seconds[dedup], peak, _ = peak_rss_of(cmd)
            totals = json.loads((out / "index.json").read_text())["totals"]
            dropped = totals.get("duplicates", {"documents": 0, "tokens": 0})
            print(f"{'--dedup ' + dedup:<22}{seconds[dedup]:>9.1f}{peak / 2**20:>9.0f}{totals['documents']:>11,}"
                  f"{dropped['documents']:>9,}{dropped['tokens']:>16,}")
            rows.append({"run": f"`--dedup {dedup}`", "seconds": f"{seconds[dedup]:.1f}",
                         "peak memory": f"{peak / 2**20:,.0f} MB", "documents kept": f"{totals['documents']:,}",
                         "dropped": f"{dropped['documents']:,}", "dropped tokens": f"{dropped['tokens']:,}"})
            if dedup == "exact":
                assert dropped["documents"] == documents - distinct, (dropped, documents - distinct)
                assert totals["documents"] == distinct
        print(f"\n--dedup exact costs {seconds['exact'] / seconds['none']:.2f}x the time of no deduplication "
              f"(hash pass + tokenizing the duplicates to count their tokens); dropped exactly the "
              f"{documents - distinct:,} repeated texts")
        rec.table(f"{a.corpus.name} with {a.duplicate:.0%} of its documents added again ({documents:,} documents), "
                  f"shard.py as one process, {a.workers} workers, seq 512", rows)
        rec.headline("time, exact ÷ none", f"{seconds['exact'] / seconds['none']:.2f}x")
        # The asserts above stop the run (and write no result) unless exactly the repeated texts were dropped.
        rec.headline("documents dropped", f"{documents - distinct:,}, exactly the repeated texts counted independently")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
