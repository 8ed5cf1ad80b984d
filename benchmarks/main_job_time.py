"""How long the main job takes here, and what it shows downstream: a fresh run, a second run, one-off costs.

    python benchmarks/main_job_time.py [--out /tmp/main-job-time] [--cold-build] [--install]

Prints the machine (cores, CPU model from /proc/cpuinfo, load average), then runs
`launchers/run_default.py --fresh` and `launchers/run_default.py` again, exactly as a user
would, and tabulates each stage's time from the job's own `logs/timings.json`. DeepSpeed's CPU
comm op is checked before and after each run: a run that rebuilt it changed its `.so`.
One-off costs, measured on request:
  --cold-build  build DeepSpeed's CPU comm op into an empty extensions folder first (the cost of a
                new environment's first pretraining), and run the job against that folder;
  --install     create a new virtual environment with launchers/setup_env.sh (pip's cache helps,
                so a machine that never downloaded the packages pays more).
What the fresh run shows is recorded beside its time: both tasks' table (each arm through the
protocol, every label count, the token-count baseline), the word-order gain against its +10-point
target, any point where the pretrained arm is below scratch by more than the seeds' spread, and
the minimal-pair accuracy against the unigram model's. The figures and the machine are written to
`<out>/main_job_time.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness import BUILD_OP, ROOT, BenchmarkRecord, Study, cpu_model

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.topology import environment_extensions_dir

STUDY = Study(
    "main_job_time", question="How long is the main job, and does its pretraining pay?",
    metric="wall seconds of the job and of each stage (its logs/timings.json); dev accuracy of both tasks",
    baseline="targets: 300 s on an AMD EPYC draw, 600 s on an Intel Xeon one; from scratch and token counts",
    arms=("fresh run", "second run"))


def machine() -> dict:
    """The machine as printed at the start and kept in `<out>/main_job_time.json`."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "load_average_1m": round(os.getloadavg()[0], 2), "python": platform.python_version(),
            "platform": platform.platform()}


def target_seconds(cpu: str) -> int:
    """The job's time target on this machine's CPU draw: 300 s on the faster (AMD EPYC), 600 s on the slower
    (Intel Xeon, about half as fast on this job), and 600 s on a CPU not seen yet."""
    return 300 if "AMD EPYC" in cpu else 600


def built_ops(extensions: Path) -> dict[str, float]:
    """Every compiled op under the extensions folder, with its modification time."""
    return {str(p.relative_to(extensions)): p.stat().st_mtime for p in extensions.glob("**/*.so")}


def timed(cmd: list[str], env: dict) -> float:
    print(f"\n$ {' '.join(map(str, cmd))}", flush=True)
    started = time.monotonic()
    subprocess.run(list(map(str, cmd)), cwd=ROOT, env=env, check=True)
    return time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("/tmp/main-job-time"))
    p.add_argument("--cold-build", action="store_true", help="measure DeepSpeed's first comm-op build, then use it")
    p.add_argument("--install", action="store_true", help="measure a new environment's set-up (launchers/setup_env.sh)")
    a = p.parse_args()
    with STUDY.record() as rec:
        measure(a, rec)


def measure(a: argparse.Namespace, rec: BenchmarkRecord) -> None:
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"machine": machine(), "one_off_s": {}}
    print(json.dumps(result["machine"], indent=2), flush=True)
    env = dict(os.environ)

    if a.install:
        venv = out / "venv"
        shutil.rmtree(venv, ignore_errors=True)
        result["one_off_s"]["install"] = round(timed(["bash", "-c", "source launchers/setup_env.sh"],
                                                     {**env, "VENV": str(venv)}), 1)
    if a.cold_build:
        extensions = out / "torch_extensions"
        shutil.rmtree(extensions, ignore_errors=True)
        env["TORCH_EXTENSIONS_DIR"] = str(extensions)
        seconds = subprocess.run([sys.executable, "-c", BUILD_OP], env={**env, "DS_ACCELERATOR": "cpu"}, check=True,
                                 capture_output=True, text=True).stdout.split()[-1]
        result["one_off_s"]["deepspeed_comm_op_build"] = round(float(seconds), 1)
        print(f"DeepSpeed comm op built into an empty {extensions} in {float(seconds):.1f} s", flush=True)
    default = environment_extensions_dir() or Path.home() / ".cache" / "torch_extensions"
    extensions = Path(env.get("TORCH_EXTENSIONS_DIR", default))

    run_dir = out / "run"
    for name, extra in (("fresh", ["--fresh"]), ("second", [])):
        before = built_ops(extensions)
        seconds = timed([sys.executable, "launchers/run_default.py", "--out", run_dir, *extra], env)
        after = built_ops(extensions)
        timings = json.loads((run_dir / "logs" / "timings.json").read_text())
        result[name] = {"total_s": round(seconds, 1), "stages_s": timings["stages_s"], "order": timings["order"],
                        "ops_built": sorted(k for k, v in after.items() if before.get(k) != v)}
    result["extensions_dir"] = str(extensions)

    stages = list(dict.fromkeys([*result["fresh"]["order"], *result["second"]["order"]]))  # in run order
    print(f"\nmain job on {result['machine']['cores']} cores ({result['machine']['cpu']}), "
          f"load average {result['machine']['load_average_1m']} at the start")
    print(f"{'stage':<24}{'fresh s':>10}{'second s':>10}")
    for stage in stages:
        cells = [result[r]["stages_s"].get(stage) for r in ("fresh", "second")]
        print(f"{stage:<24}" + "".join(f"{c:>10.1f}" if c is not None else f"{'skipped':>10}" for c in cells))
    print(f"{'total (wall)':<24}{result['fresh']['total_s']:>10.1f}{result['second']['total_s']:>10.1f}")
    for r in ("fresh", "second"):
        print(f"ops built during the {r} run: {', '.join(result[r]['ops_built']) or 'none'}")
    for what, seconds in result["one_off_s"].items():
        print(f"one-off {what}: {seconds:.1f} s")
    rec.table("stage times from the job's logs/timings.json",
              [{"stage": stage, **{f"{r} run, s": (f"{result[r]['stages_s'][stage]:.1f}"
                                                   if stage in result[r]["stages_s"] else "skipped")
                                   for r in ("fresh", "second")}} for stage in stages]
              + [{"stage": "**whole job (wall)**", "fresh run, s": f"**{result['fresh']['total_s']:.0f}**",
                  "second run, s": f"**{result['second']['total_s']:.0f}**"}])
    for r in ("fresh", "second"):
        rec.headline(f"compiled ops built during the {r} run", ", ".join(result[r]["ops_built"]) or "none")
    if result["one_off_s"]:
        rec.table("one-off costs", [{"one-off": what, "s": f"{seconds:.1f}"}
                                    for what, seconds in result["one_off_s"].items()])
    target = target_seconds(result["machine"]["cpu"])
    rec.headline("fresh run, wall", f"{result['fresh']['total_s']:.0f} s", target=f"≤ {target} s on 2 cores",
                 met=result["fresh"]["total_s"] <= target)
    record_downstream(rec, run_dir)
    write_json_atomic(out / "main_job_time.json", result)
    print(f"written {out / 'main_job_time.json'}")


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
