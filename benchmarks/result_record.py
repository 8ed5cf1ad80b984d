"""The one owner of a benchmark's result file: a figure and the conditions it was measured under, together.

    with BenchmarkRecord("packing_throughput", argv=sys.argv) as rec:
        ...
        rec.table("4,000 IMDB reviews, seq 512", rows)     # rows: [{column: value, ...}, ...], in order
        rec.headline("doc-packed ÷ doc", "1.76", target="≥ 1.4", met=True)

On entry the record notes the command, the date (ISO 8601, UTC), the machine (usable cores from
`sched_getaffinity`, all cores, the CPU model from /proc/cpuinfo, platform, Python), the 1-, 5-
and 15-minute load averages, and the git commit with whether tracked files had changes. On a
clean exit it notes the load again and writes `benchmarks/results/<name>.json` atomically,
wherever the benchmark's own `--out` points (`BENCHMARK_RESULTS_DIR` redirects it, e.g. for a
trial run). A benchmark that raises writes nothing, so a failed run never replaces a good result.
`name` may carry a variant after a dot ("pretraining_gain.budget-tiny") for settings whose
tables stand beside the default run's rather than replace them.

`benchmarks/render_tables.py` renders docs/benchmarks.md's tables from these files.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/x.py`, the repository is not on the path yet
    sys.path.insert(0, str(ROOT))
from pipeline.common.atomic_files import write_text_atomic  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def cpu_model() -> str:
    """The `model name` line of /proc/cpuinfo, or platform.processor() where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """Cores (all, and those this process may use), CPU model, platform and Python version."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    return {"cores": usable, "cores_total": os.cpu_count(), "cpu_model": cpu_model(),
            "platform": platform.platform(), "python": platform.python_version()}


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages, rounded to 0.01."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def git_state(root: Path = ROOT) -> dict[str, Any]:
    """The checkout's commit and whether tracked files had changes (the results and their page aside)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    if os.environ.get("BENCHMARK_GIT_COMMIT"):
        # A copy of a checkout made elsewhere (a lent GPU machine's copy carried a stale .git whose HEAD was not
        # the files'): the caller names the commit it copied; whether the copy had changes is then unknown.
        return {"commit": os.environ["BENCHMARK_GIT_COMMIT"], "dirty": None}
    commit = git("rev-parse", "HEAD")
    # The results and the page rendered from them are outputs, not what was measured.
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results",
                 ":!docs/benchmarks.md")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


# Settings from the environment that change what a benchmark measures, shown in front of its command.
COMMAND_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def markdown_table(rows: list[dict[str, Any]]) -> list[str]:
    """Rows of named columns (the first row's keys, in order) as the lines of a markdown table."""
    if not rows:
        return []
    columns = list(rows[0])
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows)]


def write_loss_table(rec: BenchmarkRecord, out: Path, entropy: float, runs: list[dict[str, Any]],
                     rows: list[dict[str, Any]], conditions: str, note: str) -> None:
    """A pretraining benchmark's table: printed, written as `out/table.md` with its runs in `out/results.json`,
    and recorded with the plateau's level H."""
    table = "\n".join([f"H = {entropy:.3f} nats", "", *markdown_table(rows), "", conditions])
    (out / "results.json").write_text(json.dumps({"unigram_entropy": entropy, "runs": runs}, indent=1))
    (out / "table.md").write_text(table + "\n")
    print(table)
    rec.table(conditions, rows, note=note)
    rec.results["unigram_entropy_nats"] = entropy


def command_line(argv: list[str]) -> str:
    """argv as a shell line, with the script path made relative to the repository where it can be."""
    parts = list(argv)
    if parts:
        try:
            parts[0] = str(Path(parts[0]).resolve().relative_to(ROOT))
        except ValueError:
            pass
    env = [f"{k}={shlex.quote(os.environ[k])}" for k in COMMAND_ENV if k in os.environ]
    return " ".join([*env, "python", shlex.join(parts)])


class BenchmarkRecord:
    """A benchmark run's result: fill `results` (or use `table`/`headline`) inside the `with` block."""

    def __init__(self, name: str, argv: list[str] | None = None, *, out_dir: str | os.PathLike | None = None,
                 description: str | None = None) -> None:
        if not _NAME.match(name):
            raise ValueError(f"benchmark name {name!r}: use letters, digits, '_', '-' and '.' (a variant after a dot)")
        self.name = name
        self.argv = list(sys.argv if argv is None else argv)
        self.out_dir = Path(out_dir or os.environ.get("BENCHMARK_RESULTS_DIR") or RESULTS_DIR)
        self.description = description
        self.results: dict[str, Any] = {}
        self.data: dict[str, Any] = {}

    @property
    def path(self) -> Path:
        return self.out_dir / f"{self.name}.json"

    def __enter__(self) -> BenchmarkRecord:
        git = git_state()
        self.data = {
            "benchmark": self.name,
            "provenance": "measured",
            "command": command_line(self.argv),
            "argv": self.argv,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "load_start": load_average(),
            "git_commit": git["commit"],
            "git_dirty": git["dirty"],
        }
        if self.description:
            self.data["description"] = self.description
        return self

    def table(self, title: str, rows: list[dict[str, Any]], *, note: str | None = None) -> None:
        """A table as rows of named columns, in the order given; the rows' keys, in order, are the columns."""
        columns: list[str] = []
        for row in rows:
            columns += [key for key in row if key not in columns]
        entry: dict[str, Any] = {"title": title, "columns": columns, "rows": [dict(r) for r in rows]}
        if note:
            entry["note"] = note
        self.results.setdefault("tables", []).append(entry)

    def headline(self, name: str, value: Any, *, target: str | None = None, met: bool | None = None,
                 unit: str | None = None) -> None:
        """A named headline figure; with a target, whether it was met."""
        entry: dict[str, Any] = {"value": value}
        if unit:
            entry["unit"] = unit
        if target is not None:
            entry["target"] = target
            entry["met"] = met
        self.results.setdefault("headline", {})[name] = entry

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            return False
        self.write()
        return False

    def write(self) -> Path:
        """Note the end load and write the result file atomically; returns its path."""
        self.data["load_end"] = load_average()
        self.data["date_end"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.data["results"] = self.results
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # Not write_json_atomic: its sorted keys would reorder a table's columns and the headline.
        write_text_atomic(self.path, json.dumps(self.data, indent=2, ensure_ascii=False, default=str) + "\n")
        print(f"result written to {self.path}", file=sys.stderr, flush=True)
        return self.path
