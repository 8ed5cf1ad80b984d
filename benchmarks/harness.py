"""The benchmarks' one harness: a study's declaration and record, a table's markdown, launches, and the data fixtures
(docs/benchmarks.md, "How a benchmark is written")."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/x.py`, the repository is not on the path yet
    sys.path.insert(0, str(ROOT))
from pipeline.common.atomic_files import write_text_atomic  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"
SHARED = Path(os.environ.get("PIPELINE_SHARED_DATA", ROOT.parent / "shared" / "data"))
"""The real data for benchmarks (../shared/data beside the checkout; PIPELINE_SHARED_DATA points elsewhere)."""
IMDB = SHARED / "corpus" / "imdb-reviews.jsonl.zst"
COMMAND_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
"""Settings from the environment that change what a benchmark measures, shown in front of its command."""
BUILD_OP = ("import time; from deepspeed.accelerator import get_accelerator; "
            "builder = get_accelerator().create_op_builder('ShareMemCommBuilder'); "
            "t = time.monotonic(); builder.load(); print(time.monotonic() - t)")
"""Builds (or loads) DeepSpeed's CPU comm op and prints the seconds it took."""
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def cpu_model() -> str:
    """The `model name` line of /proc/cpuinfo, or platform.processor() where there is none."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
             if line.startswith("model name")]
    return names[0] if names else platform.processor() or "unknown"


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages, rounded to 0.01."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def git_state(root: Path = ROOT) -> dict[str, Any]:
    """The checkout's commit and whether tracked files had changes (the results and the docs aside)."""
    if os.environ.get("BENCHMARK_GIT_COMMIT"):
        # A copy of a checkout made elsewhere (a lent GPU machine's copy carried a stale .git whose HEAD was not
        # the files'): the caller names the commit it copied; whether the copy had changes is then unknown.
        return {"commit": os.environ["BENCHMARK_GIT_COMMIT"], "dirty": None}

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
            return done.stdout.strip() if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results", ":!docs")
    return {"commit": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def command_line(argv: list[str]) -> str:
    """argv as a shell line, the script path relative to the repository where it can be, after the settings
    from the environment that change what a benchmark measures."""
    parts = list(argv)
    if parts and Path(parts[0]).resolve().is_relative_to(ROOT):
        parts[0] = str(Path(parts[0]).resolve().relative_to(ROOT))
    return " ".join([*(f"{k}={shlex.quote(os.environ[k])}" for k in COMMAND_ENV if k in os.environ), "python",
                     shlex.join(parts)])


@dataclasses.dataclass(frozen=True)
class Study:
    """What a benchmark compares: its arms, the metric each is measured by, and the baseline they are read against."""

    name: str
    question: str
    metric: str
    baseline: str
    arms: tuple[str, ...]

    def __post_init__(self) -> None:
        empty = [f.name for f in dataclasses.fields(self) if not getattr(self, f.name)]
        if empty or not _NAME.match(self.name):
            raise ValueError(f"study {self.name!r}: give {', '.join(empty) or 'a name of letters, digits and _'}")

    def record(self, variant: str | None = None, argv: list[str] | None = None,
               out_dir: str | os.PathLike | None = None) -> BenchmarkRecord:
        """The record of one run: `NAME.json`, or `NAME.VARIANT.json` for a run whose tables stand beside it."""
        return BenchmarkRecord(f"{self.name}.{variant}" if variant else self.name, argv, out_dir=out_dir, study=self)


class BenchmarkRecord:
    """A benchmark run's result: fill `results` (or use `table` and `headline`) inside the `with` block."""

    def __init__(self, name: str, argv: list[str] | None = None, *, out_dir: str | os.PathLike | None = None,
                 study: Study | None = None) -> None:
        if not _NAME.match(name):
            raise ValueError(f"benchmark name {name!r}: use letters, digits, '_', '-' and '.' (a variant after a dot)")
        self.name, self.study, self.argv = name, study, list(sys.argv if argv is None else argv)
        self.path = Path(out_dir or os.environ.get("BENCHMARK_RESULTS_DIR") or RESULTS_DIR) / f"{name}.json"
        self.results: dict[str, Any] = {}
        self.data: dict[str, Any] = {}  # the record around `results`: command, date, machine, load, commit, study

    def __enter__(self) -> BenchmarkRecord:
        git, cores = git_state(), os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count())
        machine = {"cores": len(cores), "cores_total": os.cpu_count(), "cpu_model": cpu_model(),
                   "platform": platform.platform(), "python": platform.python_version()}
        self.data = {"benchmark": self.name, "provenance": "measured", "command": command_line(self.argv),
                     "argv": self.argv, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                     "machine": machine, "load_start": load_average(), "git_commit": git["commit"],
                     "git_dirty": git["dirty"]}
        if self.study:
            self.data["study"] = {k: v for k, v in dataclasses.asdict(self.study).items() if k != "name"}
        print(f"{self.name}: {machine['cpu_model']}, {machine['cores']} cores, load {self.data['load_start']}",
              file=sys.stderr, flush=True)
        return self

    def table(self, title: str, rows: list[dict[str, Any]], *, note: str | None = None) -> None:
        """A table as rows of named columns, in the order given; printed as the docs will show it."""
        entry: dict[str, Any] = {"title": title, "columns": list(dict.fromkeys(k for r in rows for k in r)),
                                 "rows": [dict(r) for r in rows], **({"note": note} if note else {})}
        self.results.setdefault("tables", []).append(entry)
        print("\n".join(["", *render_table(entry)]), flush=True)

    def headline(self, name: str, value: Any, *, target: str | None = None, met: bool | None = None,
                 unit: str | None = None) -> None:
        """A named headline figure; with a target, whether it was met."""
        entry = {"value": value, **({"unit": unit} if unit else {}),
                 **({"target": target, "met": met} if target is not None else {})}
        self.results.setdefault("headline", {})[name] = entry
        print(f"{name}: {value}" + (f" (target {target}: {met})" if target is not None else ""), flush=True)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.write()

    def write(self) -> Path:
        """Note the end load and write the result file atomically; returns its path."""
        self.data.update(load_end=load_average(), results=self.results,
                         date_end=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Not write_json_atomic: its sorted keys would reorder a table's columns and the headline.
        write_text_atomic(self.path, json.dumps(self.data, indent=2, ensure_ascii=False, default=str) + "\n")
        print(f"result written to {self.path}", file=sys.stderr, flush=True)
        return self.path


def cell(value: Any) -> str:
    """One table cell: text as written, numbers compactly, a '|' escaped so it cannot split the row."""
    text = ("—" if value is None else ("yes" if value else "no") if isinstance(value, bool)
            else format(value, ".6g") if isinstance(value, float) else str(value))
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(table: dict[str, Any]) -> list[str]:
    columns = table.get("columns") or list(dict.fromkeys(k for row in table["rows"] for k in row))
    # Title and note go above the table as one paragraph (a backslash breaks the line): GFM starts a
    # table right under a paragraph, where a line below it would need a blank line either side.
    above = ([f"**{table['title']}**"] if table.get("title") else []) + ([table["note"]] if table.get("note") else [])
    lines = [line + "\\" for line in above[:-1]] + above[-1:]
    lines.append("| " + " | ".join(cell(c) for c in columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for row in table["rows"]:
        lines.append("| " + " | ".join(cell(row.get(c)) for c in columns) + " |")
    return lines + [""]


class Launch(NamedTuple):
    """One command's run: wall and child CPU seconds, the load around it, and what it printed when captured."""

    seconds: float
    cpu_seconds: float
    load_before: list[float] | None
    load_after: list[float] | None
    output: str = ""


def cpu_env(threads: int | None = None) -> dict[str, str]:
    """The environment of a launch: CPU DeepSpeed, this repository importable, this venv's tools first (a system
    ninja and the venv's keep different build logs, and would take turns rebuilding DeepSpeed's comm op, 1-2 min,
    inside whichever run's clock is running)."""
    from pipeline.common.processes.topology import use_environment_extensions_dir

    use_environment_extensions_dir()
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    return env if threads is None else {**env, "OMP_NUM_THREADS": str(threads)}


def launch(cmd: list, *, env: dict | None = None, log: Path | None = None, append: bool = False,
           cap_minutes: float | None = None, capture: bool = False, quiet: bool = False) -> Launch:
    """Run `cmd` (items made strings) from the repository root; raise with its last words unless it ends well. Output
    goes to `log` (a new file, or `append`ed), is captured (`Launch.output`), dropped (`quiet`) or shown. Past
    `cap_minutes` the command gets SIGTERM (it stops after the step; what it wrote is the result), its session SIGKILL
    two minutes later. SIGTERM goes to the launched process only: torchrun passes it on to its ranks, which stop
    their loader workers themselves (signalling those too would crash a rank)."""
    cmd = [str(c) for c in cmd]
    print("$", shlex.join(cmd), f"> {log}" if log else "", flush=True)
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    sink = open(log, "a" if append else "w") if log else None  # noqa: SIM115 (closed below)
    before, load_before, started = resource.getrusage(resource.RUSAGE_CHILDREN), load_average(), time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, start_new_session=cap_minutes is not None,
                            stdout=sink or (subprocess.PIPE if capture else subprocess.DEVNULL if quiet else None),
                            stderr=subprocess.STDOUT if sink else subprocess.PIPE if capture or quiet else None)
    stopped = False
    try:
        try:
            out, err = proc.communicate(timeout=None if cap_minutes is None else 60 * cap_minutes)
        except subprocess.TimeoutExpired:
            stopped = True
            proc.send_signal(signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
    except BaseException:  # Ctrl-C: a capped run sits in its own session, out of the terminal's reach
        if cap_minutes is not None:
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        if sink:
            sink.close()
    seconds, after = time.monotonic() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 and not stopped:
        words = log.read_text(errors="replace") if log else err or ""
        raise RuntimeError(f"{shlex.join(cmd[:4])}… exited {proc.returncode}: {words.strip()[-2000:]}")
    return Launch(seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), load_before,
                  load_average(), out or "")


def build_comm_op() -> None:
    """Build (or load) DeepSpeed's CPU comm op once, before any run's clock starts."""
    launch([sys.executable, "-c", BUILD_OP], env=cpu_env(), quiet=True)


def set_args(sets: dict[str, Any] | list[str], flag: str = "--set") -> list[str]:
    """`--set KEY=VALUE` (or another `flag`) for each of `sets`: a mapping, or KEY=VALUE texts."""
    return [x for s in ([f"{k}={v}" for k, v in sets.items()] if isinstance(sets, dict) else sets)
            for x in (flag, s)]


def comma_list(p: argparse.ArgumentParser, flag: str, text: str, allowed, empty: bool = False) -> list[str]:
    """The comma-separated items of `text`, each one of `allowed` (none at all only where `empty`)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if (not items and not empty) or any(t not in allowed for t in items):
        p.error(f"{flag}: expected a subset of {','.join(allowed)}, got {text!r}")
    return items


def finetune_command(config: str, model: str | Path, seeds: str | int, *, scratch: bool = False,
                     sweeps: list[str] = (), sets: dict[str, Any] | list[str] = ()) -> list:
    """`launchers/finetune.py` on `config` (a name or a file), from `model` or from scratch, each grid a `--sweep`."""
    return [sys.executable, "launchers/finetune.py", "--config", config, "--model", model, "--seeds", seeds,
            *(["--from-scratch"] if scratch else []), *set_args(list(sweeps), "--sweep"), *set_args(sets)]


def toy_tokenizer(vocab: int):
    """A tokenizer's description for a model built without one (RoBERTa's special ids)."""
    from pipeline.data.tokenizer import TokenizerInfo

    return TokenizerInfo("toy", "sha256:0", vocab, cls_id=0, sep_id=2, pad_id=1, mask_id=4, backend_json="{}")


def pretrain_command(config: str | Path, sets: list[str], ranks: int = 1) -> list[str]:
    """`launchers/pretrain.py --config CONFIG --set ...` on `ranks` CPU ranks (torchrun for more than one)."""
    launcher = [] if ranks == 1 else ["-m", "torch.distributed.run", "--nproc_per_node", str(ranks)]
    return [sys.executable, *launcher, "launchers/pretrain.py", "--config", str(config), *set_args(sets)]


def metrics(run_dir: Path, key: str | None = None) -> list[dict[str, Any]]:
    """A run's metrics.jsonl records (those holding `key`, if given), less a line cut short by a write or a kill."""
    path, records = run_dir / "metrics.jsonl", []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [r for r in records if key is None or key in r]


def peak_flops(n: int = 4096, repeats: int = 5, dtype: str = "fp32", device: str = "cpu") -> float:
    """FLOP/s of the best of `repeats` n × n products: the MFU denominator."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    a, b = (torch.randn(n, n, device=device, dtype=getattr(torch, {"bf16": "bfloat16", "fp16": "float16",
                                                                    "fp32": "float32"}[dtype])) for _ in range(2))
    best = float("inf")
    for i in range(repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = best if i == 0 else min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def work_dir(name: str, given: Path | None = None) -> Path:
    """`given`, else `$BENCHMARK_WORK_DIR/NAME` (default: under the system's temporary folder), created."""
    folder = (given or Path(os.environ.get("BENCHMARK_WORK_DIR", Path(tempfile.gettempdir()) / "benchmarks")) / name)
    folder.resolve().mkdir(parents=True, exist_ok=True)
    return folder.resolve()


def sample_corpus(source: str | Path | None, documents: int | None, folder: Path) -> tuple[str, list[str], Path]:
    """(source used, texts, `folder/corpus.jsonl`): the first `documents` texts (None: all) of `source` (the embedded
    default corpus, Python's documentation, when None)."""
    from itertools import islice

    from pipeline.data.corpus import CorpusOptions, iter_texts, resolve_inputs
    from pipeline.data.makers.default_corpus import write_embedded_corpus

    if source is None:
        source = folder / "embedded.jsonl"
        write_embedded_corpus(source)
    texts = list(islice(iter_texts(resolve_inputs([str(source)]), CorpusOptions()), documents))
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(source), texts, corpus


def glue_sample(glue: Path, out: Path, rows: dict[str, int | None], *, spread: bool = False) -> Path:
    """`out` as a GLUE folder of `rows`' tasks: each train.tsv cut to its first N rows (None: all), or with `spread` to
    N rows spread evenly over the file (GLUE's files are ordered); the dev files as they are."""
    from pipeline.data.tasks.catalog import GLUE_FOLDERS, task_spec

    for task, n in rows.items():
        source, target = glue / GLUE_FOLDERS[task], out / GLUE_FOLDERS[task]
        target.mkdir(parents=True, exist_ok=True)
        lines = (source / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
        header, body = ([], lines) if task_spec(task).headerless_columns else (lines[:1], lines[1:])
        n = len(body) if n is None else n
        picked = [body[i * len(body) // n] for i in range(n)] if spread and len(body) > n else body[:n]
        write_text_atomic(target / "train.tsv", "".join(header + picked))
        for dev in sorted(source.glob("dev*.tsv")):
            write_text_atomic(target / dev.name, dev.read_text(encoding="utf-8"))
    return out


def cli_data(out: Path, inputs: list[Path], *, val_fraction: float, env: dict) -> tuple[Path, Path]:
    """(tokenizer, shards) in `out`, made once by the user-facing commands (the shard stage skips a complete folder):
    a 16k byte-level BPE and 128-token shards."""
    tokenizer, shards = out / "tokenizer", out / "shards"
    if not (tokenizer / "tokenizer.json").exists():
        launch([sys.executable, "data_prep/train_tokenizer.py", "--input", *inputs, "--type", "bpe", "--vocab-size",
                16000, "--model-max-length", 128, "--out", tokenizer], env=env)
    launch([sys.executable, "data_prep/shard.py", "--input", *inputs, "--tokenizer", tokenizer, "--seq-len", 128,
            "--val-fraction", val_fraction, "--out", shards, "--quiet"], env=env)
    return tokenizer, shards
