"""Data at scale: what a run costs before and at its first step as the corpus grows, measured and extrapolated.

    python benchmarks/data_at_scale.py --work /big/disk/das [--synthetic-tokens 1e7 1e8 1e9]
        [--real-copies 5] [--imdb-copies 1 4] [--files 1000 --files-copies 5] [--corpus C.jsonl.zst]

A case is left out by giving it nothing (`--synthetic-tokens`, `--real-copies 0`, `--imdb-copies`, `--files 0`);
docs/data.md ("At scale") describes the cases and what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness import IMDB, ROOT, BenchmarkRecord, Study, launch, pretrain_command, sample_corpus

STUDY = Study(
    "data_at_scale", question="What does a run cost before and at its first step as the corpus grows?",
    metric="seconds to the first step and to a 3-step run's end, peak memory, cache bytes, resume to first batch",
    baseline="the same measures at each smaller size, extrapolated to 100B tokens; the corpus ×1 against ×4",
    arms=("synthetic sizes", "the real corpus ×k", "many files through SLURM", "index at scale"))
PYTHON = sys.executable
EXTRAPOLATE_TO = 100e9
SEQ_LEN = 128


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def read_jsonl(path: Path):
    """The corpus's lines as written (a .zst file decompressed)."""
    import zstandard

    with zstandard.open(path, "rt", encoding="utf-8") if path.suffix == ".zst" else open(path, encoding="utf-8") as f:
        yield from f


def index_tokenizer(tokenizer: Path) -> dict:
    """The tokenizer as an index.json records it."""
    import dataclasses

    from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer

    info = describe_tokenizer(load_tokenizer(tokenizer))
    return {k: v for k, v in dataclasses.asdict(info).items() if k != "backend_json"}


def run_python(code: str, what: str) -> dict:
    """`code` in a fresh process (the repository on its path, one thread); the JSON its last line prints."""
    done = subprocess.run([PYTHON, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{code}"], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_synthetic(out: Path, tokens: int, tokenizer: Path, seed: int = 0) -> dict:
    """Random ids (the tokenizer's ordinary range) in full-packed shards, committed by an index like shard.py's."""
    import numpy as np

    from pipeline.common.atomic_files import write_json_atomic
    from pipeline.data.shards.format import DEFAULT_LEVEL
    from pipeline.data.shards.index import combine_parts, part_summary_path
    from pipeline.data.shards.writer import ShardWriter

    info = index_tokenizer(tokenizer)
    low = max(info[k] for k in ("cls_id", "sep_id", "pad_id", "mask_id")) + 1  # BPE: specials first, then ordinary ids
    rng, started, writers, shard_size = np.random.default_rng(seed), time.monotonic(), {}, 8192
    counts = {"train": tokens // SEQ_LEN, "val": 1000}
    for split, sequences in counts.items():
        (out / split).mkdir(parents=True, exist_ok=True)
        writer = ShardWriter(out, split, 0, shard_size, {"synthetic": True}, DEFAULT_LEVEL)
        for first in range(0, sequences, shard_size):
            n = min(shard_size, sequences - first)
            writer.add({"input_ids": rng.integers(low, info["vocab_size"], (n, SEQ_LEN), dtype=np.uint16)})
        writer.close()
        writers[split] = writer
    identity = {"synthetic": True, "tokens": tokens, "seed": seed, "seq_len": SEQ_LEN, "pack": "full"}
    summary = {"rank": 0, "world_size": 1, "complete": True, "identity": identity, "dtype": "uint16",
               "fields": ["input_ids"], "tokenizer": info, "shards": {split: w.shards for split, w in writers.items()},
               "stats": {"sequences": sum(counts.values()), "padding_tokens": 0}, "examples": [],
               "seconds": round(time.monotonic() - started, 3)}
    part_summary_path(out, 0).parent.mkdir(exist_ok=True)
    write_json_atomic(part_summary_path(out, 0), summary)
    combine_parts(out, 1)
    return {"seconds": time.monotonic() - started, "tokens": counts["train"] * SEQ_LEN}


def shard_real(corpus: Path, copies: int, out: Path, tokenizer: Path, work: Path) -> dict:
    """The corpus ×`copies` through shard.py with two tokenizer workers; a folder an earlier run made is not remade."""
    seconds = None
    if not (out / "index.json").exists():
        source = work / f"corpus-x{copies}.jsonl"
        with open(source, "w", encoding="utf-8") as f:
            for _ in range(copies):
                f.writelines(read_jsonl(corpus))
        seconds = launch([PYTHON, "data_prep/shard.py", "--input", source, "--tokenizer", tokenizer, "--seq-len",
                          SEQ_LEN, "--out", out, "--workers", 2, "--quiet"]).seconds
        source.unlink()
    return {"seconds": seconds, "tokens": json.loads((out / "index.json").read_text())["splits"]["train"]["tokens"]}


def pretrain_run(shards: Path, tokenizer: Path, run_dir: Path, steps: int = 3) -> dict:
    """A `steps`-step run of configs/tiny.json on 1 rank: seconds to the first step and to the end, peak memory
    (`/usr/bin/time`'s maximum RSS, which covers the loader worker), bytes written to the shard cache."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cache = run_dir / "token_cache"
    overrides = [f"data.shards={shards}", f"data.tokenizer={tokenizer}", f"data.cache_dir={cache}",
                 f"train.output_dir={run_dir / 'out'}", f"train.max_steps={steps}", "train.eval_every=1000",
                 "train.export=false", "tracking.enabled=false", "checkpoint.every=1000",
                 "schedule.warmup_steps=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    command = ["/usr/bin/time", "-f", "maxrss_kb=%M", *pretrain_command("configs/tiny.json", overrides)]
    metrics = run_dir / "out" / "metrics.jsonl"
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first_step = None
    while proc.poll() is None:
        if first_step is None and metrics.exists() and "train/loss" in metrics.read_text():
            first_step = time.monotonic() - started
        time.sleep(0.05)
    out, err = proc.communicate()
    total = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"pretraining on {shards} failed:\n{err[-3000:]}")
    maxrss = int(err.rsplit("maxrss_kb=", 1)[1].split()[0])
    return {"first_step_s": first_step, "run_s": total, "peak_rss_mb": maxrss / 1024, "cache_bytes": disk_bytes(cache)}


def resume_probe(shards: Path, tokenizer: Path, run_dir: Path, fraction: float = 0.9) -> dict:
    """In a fresh process: seconds from building the run's data to its first batch at a late step (its output folder
    `run_dir/probe`, not configs/tiny.json's runs/default/pretrain, where a user's main job may be)."""
    cache = run_dir / "token_cache"
    return run_python(f"""
import json, time
from pipeline.pretrain.preflight import prepare_run
from pipeline.data.tokenizer import load_tokenizer, describe_tokenizer
from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.pretrain.plan.masking import build_masker
from pipeline.pretrain.batches.stretch_data import PretrainData, shut_down_workers
run = prepare_run("configs/tiny.json", ["data.shards={shards}", "data.tokenizer={tokenizer}",
                                      "train.output_dir={run_dir / 'probe'}", "train.max_steps=1000000000"],
                  world_size=1)  # the loader ends at max_steps: 90% of a large corpus's epoch lies past the config's
c = run.config
tok = load_tokenizer("{tokenizer}"); info = describe_tokenizer(tok)
masker = build_masker(c.masking, tok, info.vocab_size, info.mask_id, seed=0)
plan = BatchPlan.derive(c.train.global_batch_size, c.train.micro_batch_size, 1)
started = time.monotonic()
data = PretrainData(run.stretches[0], plan, masker, seed=0, cache_dir="{cache}",
                    tokenizer_fingerprint=info.fingerprint, with_segments=False, num_workers=1)
step = int({fraction} * len(data.train_batches) // plan.global_batch_size)
loader = iter(data.loader(rank=0, start_step=step))
next(loader)
print(json.dumps({{"resume_step": step, "resume_first_batch_s": time.monotonic() - started}}))
shut_down_workers(loader)
""", f"the resume probe on {shards}")


def measure_folder(name: str, shards: Path, tokenizer: Path, work: Path) -> dict:
    shard_bytes = disk_bytes(shards / "train") + disk_bytes(shards / "val")
    tokens = json.loads((shards / "index.json").read_text())["splits"]["train"]["tokens"]
    run = pretrain_run(shards, tokenizer, work / f"run-{name}")
    probe = resume_probe(shards, tokenizer, work / f"run-{name}")
    row = {"case": name, "tokens": tokens, "shard_bytes": shard_bytes, **run, **probe}
    row["cache_÷_shards"] = run["cache_bytes"] / shard_bytes
    print(json.dumps(row), flush=True)
    shutil.rmtree(work / f"run-{name}", ignore_errors=True)
    return row


def extrapolate(rows: list[dict], key: str) -> float:
    """The line through the two largest sizes, at 100B tokens (its slope floored at 0: noise is not a trend); not a
    fit over every size: below one shuffle block of shards the cache holds the whole corpus, a slope the larger lack."""
    (t1, y1), (t2, y2) = sorted((r["tokens"], r[key]) for r in rows)[-2:]
    return y2 + max(0.0, (y2 - y1) / (t2 - t1)) * (EXTRAPOLATE_TO - t2)


def index_at_scale(tokens: float, tokenizer: Path, work: Path) -> dict:
    """The part of a start that grows with the corpus, at `tokens` without writing them: an index.json of every shard
    and each shard a sparse file of its listed size, whose `TokenCache` and order at a late step a fresh process times
    and sizes (before step 1 a run reads the index, stats every shard and builds the order; no shard is read here)."""
    from pipeline.common.atomic_files import write_json_atomic
    from pipeline.data.shards.format import FORMAT_VERSION

    out = work / f"index-{tokens / 1e9:g}B"
    shutil.rmtree(out, ignore_errors=True)
    per_shard, shard_bytes = 8192, 1_900_000  # sequences and compressed bytes of a synthetic seq-128 shard
    splits = {}
    for split, n in (("train", int(tokens // (per_shard * SEQ_LEN))), ("val", 1)):
        (out / split).mkdir(parents=True)
        shards = []
        for i in range(n):
            name = f"{split}/part00000-shard{i:06d}.zst"
            with open(out / name, "wb") as f:
                f.truncate(shard_bytes)
            shards.append({"file": name, "sequences": per_shard, "tokens": per_shard * SEQ_LEN, "bytes": shard_bytes,
                           "sha256": "0" * 64})
        splits[split] = {"shards": shards, "sequences": per_shard * n, "tokens": per_shard * SEQ_LEN * n}
    write_json_atomic(out / "index.json", {
        "format_version": FORMAT_VERSION, "seq_len": SEQ_LEN, "pack": "full", "dtype": "uint16",
        "fields": ["input_ids"], "tokenizer": index_tokenizer(tokenizer), "splits": splits, "totals": {},
        "args": {"placeholder": True}})
    probe = run_python(f"""
import json, time, tracemalloc
from pipeline.data.token_cache import TokenCache
from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.data.epoch_order import CorpusLayout
from pipeline.pretrain.plan.stream import DataStream
def start():
    cache = TokenCache("{out}", "train", "{work / 'unused-cache'}")
    corpus = CorpusLayout("x", "", 0, cache.layout.sizes, cache.layout.shards_per_block, cache.seq_len)
    shuffle = DataStream([corpus], BatchPlan.derive(32, 16, 1), seed=0)
    shuffle.micro_batch(int(0.9 * len(cache) // 32), 1)
    return len(cache.layout.sizes)
started = time.monotonic()
shards = start()
seconds = time.monotonic() - started
tracemalloc.start()  # a second time, traced (tracing slows allocation, so not timed)
start()
print(json.dumps({{"shards": shards, "start_s": seconds, "traced_mb": tracemalloc.get_traced_memory()[1] / 1e6}}))
""", "the index probe")
    shutil.rmtree(out)
    return {"tokens": int(tokens)} | probe


def many_files(corpus: Path, files: int, copies: int, parts: int, tokenizer: Path, work: Path) -> dict:
    """The corpus ×`copies`, cut into `files` files and sharded by the SLURM array path into one verified folder."""
    from pipeline.data.shards.index import verify_folder

    inputs = work / "many-files"
    shutil.rmtree(inputs, ignore_errors=True)
    inputs.mkdir(parents=True)
    handles = [open(inputs / f"part{i:04d}.jsonl", "w", encoding="utf-8") for i in range(files)]
    for copy in range(copies):  # a copy's documents go to other files than the last copy's: repeats stay apart
        for i, line in enumerate(read_jsonl(corpus)):
            handles[(i + copy * 7919) % files].write(line)
    for h in handles:
        h.close()
    base = Path("/tmp") / f"das-slurm-{os.getpid()}"  # munge needs an a+x path to its socket
    base.mkdir(mode=0o755, exist_ok=True)
    base.chmod(0o755)
    env = {**os.environ, "BASE": str(base), "NODES": "1", "PORT_BASE": str(19000 + os.getpid() % 500 * 4)}
    started = time.monotonic()
    subprocess.run(["bash", str(ROOT / "tests" / "slurm" / "setup.sh")], env=env, check=True, capture_output=True)
    cluster_s = time.monotonic() - started
    env["SLURM_CONF"] = str(base / "etc" / "slurm.conf")
    out = work / "many-files-shards"
    shutil.rmtree(out, ignore_errors=True)
    config = work / "many-files.json"
    config.write_text(json.dumps({"input": [str(inputs)], "tokenizer": str(tokenizer), "seq_len": SEQ_LEN,
                                  "out": str(out), "workers": 1}))
    try:
        started = time.monotonic()
        jobs = subprocess.run([PYTHON, "launchers/submit.py", "shard", "--config", str(config), "--parts", str(parts),
                               "--time", "01:00:00"], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        combine_job = jobs.stdout.split()[-1]
        while subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True).stdout.strip():
            time.sleep(1)
        seconds = time.monotonic() - started
        shown = subprocess.run(["scontrol", "show", "job", combine_job], env=env, capture_output=True,
                               text=True).stdout
    finally:
        subprocess.run(["bash", str(ROOT / "tests" / "slurm" / "teardown.sh")], env=env, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    problems = verify_folder(out)
    index = json.loads((out / "index.json").read_text()) if (out / "index.json").exists() else {}
    result = {"files": files, "copies": copies, "parts": parts, "cluster_start_s": cluster_s,
              "array_and_combine_s": seconds,
              "combine_job_state": "COMPLETED" if "JobState=COMPLETED" in shown else shown[:200],
              "tokens": index.get("splits", {}).get("train", {}).get("tokens"),
              "parts_in_index": len(index.get("parts", [])), "verify_problems": len(problems)}
    shutil.rmtree(inputs, ignore_errors=True)
    return result | {"shards": str(out)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, required=True, help="scratch folder (room for the largest synthetic size)")
    p.add_argument("--corpus", type=Path, default=IMDB, help="real text: JSON lines with a text field")
    p.add_argument("--synthetic-tokens", type=float, nargs="*", default=[1e7, 1e8, 1e9])
    p.add_argument("--real-copies", type=int, default=5)
    p.add_argument("--imdb-copies", type=int, nargs="*", default=[1, 4])
    p.add_argument("--files", type=int, default=1000)
    p.add_argument("--files-copies", type=int, default=5, help="the corpus repeated this many times before the cut")
    p.add_argument("--slurm-parts", type=int, default=4)
    p.add_argument("--index-tokens", type=float, nargs="*", default=[1e9, 1e10, 1e11],
                   help="sizes whose index and shard stats are measured with sparse placeholder shards")
    p.add_argument("--variant", default=None, help="record as data_at_scale.VARIANT (a partial run)")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    with STUDY.record(args.variant) as rec:
        measure(args, rec)


def measure(args: argparse.Namespace, rec: BenchmarkRecord) -> None:
    from pipeline.data.tokenizer import train_tokenizer

    work, tokenizer = args.work, args.work / "tokenizer"  # an 8k byte-level BPE on the corpus's first 20,000 documents
    if not (tokenizer / "tokenizer.json").exists():
        train_tokenizer(sample_corpus(args.corpus, 20_000, work)[1], "bpe", 8192, tokenizer, model_max_length=512)
    synthetic, real, preparation = [], [], []
    cases = [(synthetic, work / f"synthetic-{size / 1e6:g}M", size) for size in args.synthetic_tokens]
    cases += [(real, work / f"real-x{c}", c) for c in [*args.imdb_copies, args.real_copies] if c]
    for rows, folder, size in cases:
        made = (write_synthetic(folder, int(size), tokenizer) if rows is synthetic
                else shard_real(args.corpus, size, folder, tokenizer, work))
        preparation.append({"case": folder.name, "how": "shard writer, random ids" if rows is synthetic else
                            "shard.py, 2 workers", "tokens": f"{made['tokens']:,}",
                            "seconds": "made earlier" if made["seconds"] is None else f"{made['seconds']:.1f}",
                            "shard MB": f"{disk_bytes(folder) / 1e6:,.0f}"})
        rows.append(measure_folder(folder.name, folder, tokenizer, work))
        if rows is synthetic:
            shutil.rmtree(folder)
    if args.files:
        slurm = many_files(args.corpus, args.files, args.files_copies, args.slurm_parts, tokenizer, work)
        rec.table(f"{args.files:,} input files (the corpus ×{args.files_copies}) through the SLURM array path "
                  f"({args.slurm_parts} array tasks, then the combine job) into one folder, verified", [slurm])
        rec.headline("many files through SLURM: one verified folder",
                     f"{slurm['parts_in_index']} parts, {slurm['verify_problems']} problems",
                     target="every part, 0 problems",
                     met=slurm["parts_in_index"] == args.slurm_parts and slurm["verify_problems"] == 0)
        if slurm["verify_problems"] == 0:
            real.append(measure_folder(f"slurm-{args.files}-files", Path(slurm["shards"]), tokenizer, work))
    if args.index_tokens:
        probes = [index_at_scale(t, tokenizer, work) for t in args.index_tokens]
        rec.table("what grows with the corpus before step 1, measured with sparse placeholder shards: reading "
                  "index.json, a stat per shard, the epoch order at 90% of the epoch (fresh process)",
                  [{"tokens": f"{r['tokens']:,}", "shards": f"{r['shards']:,}", "seconds": f"{r['start_s']:.2f}",
                    "Python allocations, peak (MB)": f"{r['traced_mb']:.1f}"} for r in probes])
    rec.table("shard folders made", preparation)
    columns = {"first step (s)": "first_step_s", "3-step run (s)": "run_s", "peak RSS (MB)": "peak_rss_mb",
               "cache written (MB)": "cache_bytes", "resume at 90% of the epoch, data to first batch (s)":
               "resume_first_batch_s"}
    table = [{"case": row["case"], "tokens": f"{row['tokens']:,}", "figures": "measured",
              **{k: f"{row[v] / (1e6 if v == 'cache_bytes' else 1):,.1f}" for k, v in columns.items()},
              "cache ÷ shards": f"{row['cache_÷_shards']:.2f}"} for row in synthetic + real]
    if len(synthetic) >= 2:
        table.append({"case": "100B tokens", "tokens": f"{EXTRAPOLATE_TO:,.0f}",
                      "figures": "extrapolated (line through the two largest synthetic sizes)",
                      **{k: f"{extrapolate(synthetic, v) / (1e6 if v == 'cache_bytes' else 1):,.1f}"
                         for k, v in columns.items()}, "cache ÷ shards": "—"})
    rec.table("a 3-step run of configs/tiny.json on 1 rank (1 loader worker), seq 128", table)
    by_copies = {r["case"]: r for r in real}
    if "real-x1" in by_copies and "real-x4" in by_copies:
        one, four = by_copies["real-x1"], by_copies["real-x4"]
        rec.headline("corpus ×4 ÷ ×1: 3-step run time", f"{four['run_s'] / one['run_s']:.2f}", target="≤ 1.5",
                     met=four["run_s"] / one["run_s"] <= 1.5)
        rec.headline("corpus ×4 ÷ ×1: peak memory", f"{four['peak_rss_mb'] / one['peak_rss_mb']:.2f}",
                     target="≤ 1.5", met=four["peak_rss_mb"] / one["peak_rss_mb"] <= 1.5)
        rec.headline("corpus ×4: cache written ÷ shards", f"{four['cache_÷_shards']:.2f}", target="≤ 0.5",
                     met=four["cache_÷_shards"] <= 0.5)


if __name__ == "__main__":
    main()
