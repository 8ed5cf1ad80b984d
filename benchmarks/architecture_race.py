"""Placeholder, completed below."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def open_record(name: str, argv: list[str]):
    """benchmarks/result_record.py's BenchmarkRecord where it exists; until it is merged, the same JSON keys."""
    try:
        from benchmarks.result_record import BenchmarkRecord
    except ImportError:
        BenchmarkRecord = None
    if BenchmarkRecord is not None:
        with BenchmarkRecord(name, argv=argv) as rec:
            yield rec
        return

    class Record:
        results: dict = {}

    rec = Record()
    rec.results = {}
    load_start = os.getloadavg()
    date = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    yield rec
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    out = ROOT / "benchmarks" / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"command": " ".join([sys.executable.rsplit("/", 1)[-1], *argv]), "date": date,
            "machine": {"cores": os.cpu_count(), "cpu_model": cpu}, "load_start": list(load_start),
            "load_end": list(os.getloadavg()), "git_commit": commit, "results": rec.results}
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(out)
