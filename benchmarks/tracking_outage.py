"""Step time with a live MLflow tracking server and with the server killed mid-run (then restarted), in one run.

    python benchmarks/tracking_outage.py [--steps 400] [--kill-at 60] [--hidden 64]

Both arms pretrain the same small encoder (2 layers, `--hidden`, seq 64, batch 16) in one process
on shards made here from synthetic text, logging every step to a real `mlflow server` (sqlite,
127.0.0.1, one worker). In the outage arm the server is SIGKILLed after step `--kill-at` and
started again at once; it is down while it starts (about 12 s on a quiet machine). Step times are
the gaps between consecutive steps' `time` in metrics.jsonl (checkpoint and evaluation steps
excluded), so the arms compare the steps the server's absence could slow. Also recorded: the
warnings naming the server, and whether MLflow held every step's loss after the catch-up.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from result_record import BenchmarkRecord  # noqa: E402

PYTHON = sys.executable
WORDS = ("the a model token encoder shard packing corpus reader document sequence batch mask river mountain "
         "quietly seven orange language tensor gradient learning pretraining").split()


def make_data(work: Path) -> tuple[Path, Path]:
    from pipeline.data.shard_options import ShardOptions
    from pipeline.data.shard_stage import run_shard_stage
    from pipeline.data.tokenizer import train_tokenizer

    rng = random.Random(0)
    docs = [f"doc{i} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 120))) + "." for i in range(400)]
    (work / "corpus.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    train_tokenizer(docs, "bpe", 400, work / "tok", min_frequency=1)
    run_shard_stage(ShardOptions(inputs=(str(work / "corpus.jsonl"),), tokenizer=str(work / "tok"), seq_len=64,
                                 out=str(work / "shards"), workers=1, shard_size=100, val_fraction=0.1, quiet=True))
    return work / "shards", work / "tok"


def start_server(root: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen([str(Path(PYTHON).parent / "mlflow"), "server", "--backend-store-uri",
                             f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def wait_ready(uri: str, within: float = 180) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=1).read()
            return time.monotonic() - started
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"mlflow server at {uri} did not answer within {within} s")


def train_records(metrics: Path) -> list[dict]:
    if not metrics.exists():
        return []
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if "train/loss" in r]


def run_arm(work: Path, name: str, shards: Path, tok: Path, a: argparse.Namespace) -> dict:
    from mlflow.tracking import MlflowClient

    from pipeline.common.topology import free_port

    root = work / name
    root.mkdir()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(root, port)
    ready_s = wait_ready(uri)
    out = root / "run"
    config = {"model": {"num_hidden_layers": 2, "hidden_size": a.hidden, "num_attention_heads": 4,
                        "intermediate_size": 2 * a.hidden},
              "data": {"shards": str(shards), "tokenizer": str(tok), "num_workers": 0},
              "optimizer": {"lr": 2e-3}, "schedule": {"warmup_steps": 2},
              "train": {"output_dir": str(out), "max_steps": a.steps, "global_batch_size": 16, "micro_batch_size": 16,
                        "eval_sequences": 32, "log_every": 1, "export": False},
              "checkpoint": {"every": 10**6}, "tracking": {"enabled": True, "uri": uri, "experiment": "outage"}}
    (root / "config.json").write_text(json.dumps(config))
    run = subprocess.Popen([PYTHON, "launchers/pretrain.py", "--config", str(root / "config.json")], cwd=ROOT,
                           env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    metrics = out / "metrics.jsonl"
    killed_at = back_at = None
    restarted = None
    try:
        if name == "outage":
            while len(train_records(metrics)) < a.kill_at:
                if run.poll() is not None:
                    raise RuntimeError(run.stdout.read()[-3000:])
                time.sleep(0.05)
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            killed_at = len(train_records(metrics))
            restarted = start_server(root, port)
            down_s = wait_ready(uri)
            back_at = len(train_records(metrics))
        log, _ = run.communicate(timeout=1800)
        if run.returncode != 0:
            raise RuntimeError(log[-3000:])
        steps = train_records(metrics)
        gaps = [(b["step"], b["time"] - a_["time"]) for a_, b in zip(steps, steps[1:], strict=False)]
        gaps = [(s, g) for s, g in gaps if s > 2]  # the first steps carry one-off costs
        all_ms = [g * 1000 for _, g in gaps]
        row = {"arm": "server killed mid-run, restarted" if name == "outage" else "live server",
               "steps": len(steps), "median step ms": round(statistics.median(all_ms), 1),
               "p95 step ms": round(sorted(all_ms)[int(0.95 * (len(all_ms) - 1))], 1),
               "max step ms": round(max(all_ms), 1), "server ready s": round(ready_s, 1)}
        if name == "outage":
            during = [g * 1000 for s, g in gaps if killed_at < s <= back_at]
            row.update({"killed after step": killed_at, "back at step": back_at, "outage s": round(down_s, 1),
                        "median step ms during outage": round(statistics.median(during), 1) if during else None,
                        "max step ms during outage": round(max(during), 1) if during else None})
        row["warnings naming the server"] = sum(1 for line in log.splitlines()
                                                if "warning" in line.lower() and f"127.0.0.1:{port}" in line)
        run_id = json.loads((out / "tracking.json").read_text())["run_id"]
        logged = {m.step for m in MlflowClient(uri).get_metric_history(run_id, "train/loss")}
        row["steps in MLflow after catch-up"] = len(logged)
        return row
    finally:
        for proc in (run, server, restarted):
            if proc is not None and proc.poll() is None:
                (os.killpg(proc.pid, signal.SIGKILL) if proc is not run else proc.kill())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--kill-at", type=int, default=60, help="kill the server after this many logged steps")
    p.add_argument("--hidden", type=int, default=64)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tracking-outage-"))
    try:
        with BenchmarkRecord("tracking_outage", argv=sys.argv) as rec:
            shards, tok = make_data(work)
            rows = [run_arm(work, name, shards, tok, a) for name in ("live", "outage")]
            for row in rows:
                print(json.dumps(row))
            rec.table(f"pretraining step time, 2 layers × hidden {a.hidden}, batch 16 × seq 64, one process", rows,
                      note="step = gap between consecutive steps in metrics.jsonl; the server is down from the kill "
                           "until the restarted one answers")
            live, outage = rows
            ratio = outage["median step ms during outage"] / live["median step ms"]
            rec.headline("median step during the outage ÷ with a live server", round(ratio, 2), target="≤ 1.5",
                         met=ratio <= 1.5)
            rec.headline("steps in MLflow after catch-up", f"{outage['steps in MLflow after catch-up']} of "
                         f"{outage['steps']}", target="all", met=outage["steps in MLflow after catch-up"] == a.steps)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
