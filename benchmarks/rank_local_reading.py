"""Rank-local reading: bytes each rank reads, and a 4-part array against one process, measured in one run.

    python benchmarks/rank_local_reading.py [--corpus FILE] [--files 8] [--tokenizer DIR]

1. The corpus (default: the shared IMDB reviews, 75,000 documents) is laid out three ways: split
   into `--files` plain .jsonl files, as one plain .jsonl file, and as the one .jsonl.zst file.
2. For W = 1, 2, 4, every rank's input pieces are read with the stage's own byte counter (the
   code path `shard.py` uses, without tokenizing). Before rank-local reading every rank read the
   whole corpus, i.e. 1.00x of a single rank's bytes. Target: a rank of 4 reads <= 0.30x.
3. Wall time on the same cores: `shard.py` as one process (`--workers` = cores) against a 4-part
   array (4 `shard.py --rank R --world-size 4 --workers 1` processes at once), on the one plain
   file; the array's bytes per rank come from its own part summaries, to check step 2 against
   the real stage.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench_corpus import bench_tokenizer  # noqa: E402
from result_record import BenchmarkRecord  # noqa: E402

SHARED_CORPUS = ROOT.parent / "shared" / "data" / "corpus" / "imdb-reviews.jsonl.zst"


def lay_out(corpus: Path, work: Path, files: int) -> dict[str, list[Path]]:
    """The corpus as several plain files, as one plain file, and as one compressed file."""
    import zstandard

    with open(corpus, "rb") as fh:
        raw = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True)
        lines = io.BufferedReader(raw).read().splitlines(keepends=True)
    one = work / "one" / "corpus.jsonl"
    one.parent.mkdir(parents=True)
    one.write_bytes(b"".join(lines))
    many = work / "many"
    many.mkdir()
    paths = []
    for i in range(files):  # contiguous chunks, as a corpus is usually cut
        path = many / f"corpus-{i:02d}.jsonl"
        path.write_bytes(b"".join(lines[len(lines) * i // files: len(lines) * (i + 1) // files]))
        paths.append(path)
    zst = work / "zst" / "corpus.jsonl.zst"
    zst.parent.mkdir()
    zst.write_bytes(zstandard.ZstdCompressor(level=3).compress(one.read_bytes()))
    return {f"{files} plain files": paths, "1 plain file": [one], "1 .zst file": [zst]}


def bytes_per_rank(inputs: list[Path], world_size: int) -> tuple[list[int], float, int]:
    """Bytes each rank reads (the stage's counter), the slowest rank's reading seconds, and all ranks' records."""
    from pipeline.data.corpus import CorpusOptions, resolve_inputs
    from pipeline.data.input_pieces import assign_inputs, iter_piece_batches
    from pipeline.data.record_reader import ByteCounter

    sources = resolve_inputs([str(p) for p in inputs])
    read, slowest, records = [], 0.0, 0
    for rank in range(world_size):
        counter = ByteCounter()
        started = time.perf_counter()
        pieces = assign_inputs(sources, rank, world_size)
        records += sum(len(b.lines) for b in iter_piece_batches(pieces, CorpusOptions(), rank, world_size, counter))
        slowest = max(slowest, time.perf_counter() - started)
        read.append(counter.total)
    return read, slowest, records


def shard_cmd(inputs: Path, tokenizer: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "data_prep/shard.py", "--input", str(inputs), "--tokenizer", str(tokenizer),
            "--seq-len", "512", "--out", str(out), "--quiet", *extra]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=SHARED_CORPUS, help="a .jsonl.zst corpus")
    parser.add_argument("--files", type=int, default=8, help="how many files the several-files layout has")
    parser.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder (default: train 16k BPE)")
    parser.add_argument("--skip-wall", action="store_true", help="only measure bytes read")
    a = parser.parse_args()
    if not a.corpus.is_file():
        raise SystemExit(f"{a.corpus}: no such corpus (see ../shared/data/README.md)")
    with BenchmarkRecord("rank_local_reading", argv=sys.argv) as rec:
        measure(a, rec)


def measure(a: argparse.Namespace, rec: BenchmarkRecord) -> None:
    cores = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="rank-local-"))
    try:
        layouts = lay_out(a.corpus, work, a.files)
        print(f"corpus {a.corpus.name}: {layouts['1 plain file'][0].stat().st_size / 2**20:.1f} MiB plain, "
              f"{layouts['1 .zst file'][0].stat().st_size / 2**20:.1f} MiB compressed; {cores} cores\n")
        print(f"{'layout':<18}{'W':>3}{'max MiB/rank':>14}{'vs W=1':>8}{'read s (slowest)':>18}")
        results, rows = {}, []
        for name, inputs in layouts.items():
            single = everything = None
            rows.append({"layout": name})
            for world_size in (1, 2, 4):
                read, seconds, records = bytes_per_rank(inputs, world_size)
                single, everything = single or read[0], everything or records
                assert records == everything, f"{name}, W={world_size}: {records} records, not {everything}"
                results[(name, world_size)] = max(read) / single
                print(f"{name:<18}{world_size:>3}{max(read) / 2**20:>14.1f}{max(read) / single:>8.2f}{seconds:>18.2f}")
                rows[-1][f"W={world_size}"] = (f"{max(read) / 2**20:.1f} MiB, " if world_size == 1 else "") + \
                    f"{max(read) / single:.2f}x"
        print(f"\na rank of 4 reads {results[('1 plain file', 4)]:.2f}x (one plain file) and "
              f"{results[(f'{a.files} plain files', 4)]:.2f}x ({a.files} files) of a single rank's bytes "
              "(target <= 0.30x; before: 1.00x)")
        rec.table(f"bytes the slowest rank reads, {a.corpus.name}, against a single rank's", rows)
        worst = max(results[("1 plain file", 4)], results[(f"{a.files} plain files", 4)])
        rec.headline("bytes read by a rank of 4 (plain files)", f"{worst:.2f}x", target="≤ 0.30x", met=worst <= 0.30)
        if a.skip_wall:
            return

        tokenizer = a.tokenizer or bench_tokenizer(a.corpus, work / "tok")
        one = layouts["1 plain file"][0]
        started = time.perf_counter()
        subprocess.run(shard_cmd(one, tokenizer, work / "single", "--workers", str(cores)), cwd=ROOT, check=True)
        single_s = time.perf_counter() - started
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        started = time.perf_counter()
        procs = [subprocess.Popen(shard_cmd(one, tokenizer, work / "array", "--workers", "1", "--rank", str(r),
                                            "--world-size", "4"), cwd=ROOT, env=env) for r in range(4)]
        if any(p.wait() for p in procs):
            raise SystemExit("a part of the array failed")
        array_s = time.perf_counter() - started
        single_index = json.loads((work / "single" / "index.json").read_text())
        array_index = json.loads((work / "array" / "index.json").read_text())
        assert array_index["totals"]["document_tokens"] == single_index["totals"]["document_tokens"]
        per_rank = [p["input_bytes_read"] / single_index["parts"][0]["input_bytes_read"] for p in array_index["parts"]]
        print(f"\nshard.py, one process, --workers {cores}: {single_s:6.1f} s")
        print(f"shard.py, 4-part array, --workers 1 each: {array_s:6.1f} s  ({single_s / array_s:.2f}x the speed; "
              f"the same {array_index['totals']['document_tokens']:,} tokens)")
        print("bytes read per rank in the array (from its part summaries), vs the single process: "
              + ", ".join(f"{r:.2f}x" for r in per_rank))
        rec.table(f"wall time, one plain file, seq 512 ({array_index['totals']['document_tokens']:,} tokens)",
                  [{"run": f"one process, `--workers {cores}`", "seconds": f"{single_s:.1f}",
                    "speed vs one process": "1.00"},
                   {"run": "4-part array, `--workers 1` each, at once", "seconds": f"{array_s:.1f}",
                    "speed vs one process": f"{single_s / array_s:.2f}"}])
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
