"""How long the main job takes here, and what it shows downstream: a fresh run, a second run, one-off costs.

docs/benchmarks.md ("How long the main job takes") and docs/design.md (`--install`) say what it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from harness import BenchmarkRecord, Study, cpu_model, launch

from pipeline.common.processes.topology import environment_extensions_dir

STUDY = Study(
    "main_job_time", question="How long is the main job, and does its pretraining pay?",
    metric="wall seconds of the job and of each stage (its logs/timings.json); dev accuracy of both tasks",
    baseline="targets: 300 s on an Intel Xeon draw with AMX, 400 s on an AMD EPYC one; from scratch and token counts",
    arms=("fresh run", "second run"))


def time_target(cpu: str) -> int:
    """The fresh run's wall-time target on 2 cores: 300 s on an Intel Xeon with AMX, 400 s on an AMD EPYC (no AMX,
    slower per core here), 600 s on a CPU not seen yet."""
    from pipeline.models.precision import cpu_flags

    if "amx_bf16" in cpu_flags(Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").exists()
                               else ""):
        return 300
    return 400 if "AMD EPYC" in cpu else 600


def built_ops(extensions: Path) -> dict[str, float]:
    """Every compiled op under the extensions folder, with its modification time."""
    return {str(p.relative_to(extensions)): p.stat().st_mtime for p in extensions.glob("**/*.so")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("/tmp/main-job-time"))
    p.add_argument("--install", action="store_true", help="measure a new environment's set-up (launchers/setup_env.sh)")
    a = p.parse_args()
    with STUDY.record() as rec:
        measure(a, rec)


def measure(a: argparse.Namespace, rec: BenchmarkRecord) -> None:
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env, one_off = dict(os.environ), {}
    if a.install:
        shutil.rmtree(out / "venv", ignore_errors=True)
        one_off["install"] = launch(["bash", "-c", "source launchers/setup_env.sh"],
                                    env={**env, "VENV": str(out / "venv")}).seconds
    default = environment_extensions_dir() or Path.home() / ".cache" / "torch_extensions"
    extensions = Path(env.get("TORCH_EXTENSIONS_DIR", default))

    run_dir, runs = out / "run", {}
    for name, extra in (("fresh", ["--fresh"]), ("second", [])):
        before = built_ops(extensions)
        seconds = launch([sys.executable, "launchers/run_default.py", "--out", run_dir, *extra], env=env).seconds
        timings = json.loads((run_dir / "logs" / "timings.json").read_text())
        runs[name] = {"total_s": seconds, "stages_s": timings["stages_s"], "order": timings["order"],
                      "ops_built": sorted(k for k, v in built_ops(extensions).items() if before.get(k) != v)}
    stages = list(dict.fromkeys([*runs["fresh"]["order"], *runs["second"]["order"]]))  # in run order
    rec.table("stage times from the job's logs/timings.json",
              [{"stage": stage, **{f"{r} run, s": f"{run['stages_s'][stage]:.1f}" if stage in run["stages_s"]
                                   else "skipped" for r, run in runs.items()}} for stage in stages]
              + [{"stage": "**whole job (wall)**", **{f"{r} run, s": f"**{run['total_s']:.0f}**"
                                                      for r, run in runs.items()}}])
    for r, run in runs.items():
        rec.headline(f"compiled ops built during the {r} run", ", ".join(run["ops_built"]) or "none")
    if one_off:
        rec.table("one-off costs", [{"one-off": what, "s": f"{seconds:.1f}"} for what, seconds in one_off.items()])
    target = time_target(cpu_model())
    rec.headline("fresh run, wall", f"{runs['fresh']['total_s']:.0f} s", target=f"≤ {target} s on 2 cores",
                 met=runs["fresh"]["total_s"] <= target)
    record_downstream(rec, run_dir)


def record_downstream(rec: BenchmarkRecord, run_dir: Path) -> None:
    """The fresh run's task table, word-order gain, points below scratch and minimal pairs, from its files."""
    from pipeline.common.run_layout import MainJobLayout
    from pipeline.tracking.task_report import minimal_pairs_line, task_arms, task_findings, task_rows

    layout = MainJobLayout(run_dir)
    header, *rows = task_rows(layout)
    rec.table("both tasks: dev accuracy, median of 3 seeds [min–max], each arm's learning rate chosen on held-out "
              "train", [dict(zip(header, row, strict=True)) for row in rows])
    for finding in task_findings(layout):
        print(finding)
    arms = task_arms(layout, "word-order")
    if all(arms.values()):
        gap = 100 * (arms["pretrained"].median - arms["from-scratch"].median)
        rec.headline("word order: pretrained − from scratch (medians, all labels)", f"{gap:+.1f} points",
                     target="≥ +10 points", met=gap >= 10)
    below = [f for f in task_findings(layout) if "BELOW" in f]
    rec.headline("points where pretrained is below from scratch by more than the seeds' spread",
                 "; ".join(below) or "none", target="none", met=not below)
    if (pairs := minimal_pairs_line(layout)) is not None:
        rec.headline("minimal pairs from held-out text: export (unigram model)", pairs)


if __name__ == "__main__":
    main()
