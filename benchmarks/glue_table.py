"""The GLUE table: CoLA, SST-2, MRPC, STS-B and RTE for an export, the same architecture from scratch and MiniLM.

    python benchmarks/glue_table.py --export runs/recipe-round-2/pretrain [--arms export,scratch,minilm] [--out DIR]

docs/benchmarks.md ("The GLUE table") says how a cell runs, and how `--out` keeps finished cells."""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness

from pipeline.common.atomic_files import write_json_atomic
from pipeline.models.fingerprints import describe_differences, model_fingerprint
from pipeline.tracking.finetune_report import finetune_result, read_json

TASKS = ("cola", "sst2", "mrpc", "stsb", "rte")
ARMS = ("export", "scratch", "minilm")
ARM_TITLES = {"export": "export", "scratch": "from scratch", "minilm": "MiniLM-L6 (released)"}
STUDY = harness.Study(
    "glue_table", question="What does the GLUE table say?", metric="each task's GLUE dev metric, median [min–max] "
    "over seeds, each arm's learning rate chosen on held-out train", baseline="the same architecture from scratch, "
    "the released MiniLM-L6, and the token-count baseline", arms=tuple(ARM_TITLES.values()))
DEFAULT_SWEEP = ["train.learning_rate=1e-4,1e-3"]
DEFAULT_MINILM_SWEEP = ["train.learning_rate=3e-5,1e-4"]
RELATIVE_COST = {"minilm": 8, "export": 1, "scratch": 1}
"""Rough compute per example (MiniLM: 6 layers of 384 against the budget models' 3 of 192): longest cells first."""


def claim_out(out: Path, settings: dict) -> None:
    """Write --out's settings, or refuse when they differ from the ones its cells were made with."""
    saved = read_json(out / "settings.json")
    if saved is not None:
        differs = describe_differences(saved, settings)
        if differs:
            raise SystemExit(f"--out {out}: its cells were made otherwise ({'; '.join(differs)}); "
                             "pass another --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "settings.json", settings)


def finetune_cell(a: argparse.Namespace, out: Path, glue: Path, task: str, arm: str, model: Path, env: dict) -> None:
    """One task for one arm through the protocol, its log in <out>/logs."""
    folder = out / f"{task}-{arm}"
    cmd = harness.finetune_command(
        f"configs/glue/{task}.json", model, a.seeds, scratch=arm == "scratch",
        sweeps=a.minilm_sweep if arm == "minilm" else a.sweep,
        sets={"data.glue_dir": glue, "train.epochs": a.epochs, "train.batch_size": 32, "train.output_dir": folder,
              "tracking.uri": f"sqlite:///{out / 'mlflow.db'}", "tracking.experiment": "glue-table"})
    harness.launch(cmd, env=env, log=out / "logs" / f"{folder.name}.log", append=True)  # a rerun adds to it


def token_counts(a: argparse.Namespace, out: Path, glue: Path, task: str) -> None:
    """The task's token-count baseline on the same training examples, once (<out>/<task>-token-counts.json)."""
    result = out / f"{task}-token-counts.json"
    if not result.exists():
        harness.launch([sys.executable, "launchers/token_baseline.py", "--config", f"configs/glue/{task}.json",
                        "--set", f"data.glue_dir={glue}", "--json", result], quiet=True)


def cell_text(out: Path, task: str, arm: str) -> tuple[str, str, str | None]:
    """(the cell, the chosen setting, the metric) or "not run"."""
    result = finetune_result(out / f"{task}-{arm}" / "metrics.json")
    if result is None:
        return "not run", "", None
    point = result.curve[-1]  # all its training examples
    chosen = ",".join(f"{v}" for v in result.chosen.values())
    return f"{point.median:.3f} [{point.low:.3f}–{point.high:.3f}]", chosen, result.metric


def table_rows(out: Path) -> list[dict]:
    """A row per task from every cell finished in `out`: each arm's median [min–max], the token counts, the choices."""
    rows = []
    for task in TASKS:
        texts = {arm: cell_text(out, task, arm) for arm in ARMS}
        metric = next((m for _, _, m in texts.values() if m), None)
        baseline = read_json(out / f"{task}-token-counts.json") or {}
        rows.append({"task": task, "metric": metric or "—",
                     "token counts": f"{baseline[metric]:.3f}" if metric in baseline else "—",
                     **{ARM_TITLES[arm]: texts[arm][0] for arm in ARMS},
                     "chosen LR (export / scratch / MiniLM)": " / ".join(texts[arm][1] or "—" for arm in ARMS)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--export", type=Path, required=True, help="a pretraining output folder (or its export)")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--train-examples", type=int, default=2000,
                   help="training examples of each task, spread evenly over its file")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--sweep", action="append", default=None, metavar="KEY=V1,V2,...",
                   help=f"the export's and scratch's sweep (default {' '.join(DEFAULT_SWEEP)})")
    p.add_argument("--minilm-sweep", action="append", default=None, metavar="KEY=V1,V2,...",
                   help=f"MiniLM's sweep (default {' '.join(DEFAULT_MINILM_SWEEP)})")
    p.add_argument("--out", type=Path, default=None, help="the cells (default: a work folder, not runs/)")
    a = p.parse_args()
    a.sweep, a.minilm_sweep = a.sweep or DEFAULT_SWEEP, a.minilm_sweep or DEFAULT_MINILM_SWEEP
    arms, tasks = harness.comma_list(p, "--arms", a.arms, ARMS), harness.comma_list(p, "--tasks", a.tasks, TASKS)
    glue, export = harness.SHARED / "glue", a.export.resolve()
    if (export / "export" / "config.json").exists():  # a pretraining output folder: its export
        export = export / "export"
    if not (export / "config.json").exists():
        p.error(f"--export {a.export}: expected a pretraining output folder or an export (no config.json there)")
    if not glue.is_dir():
        p.error(f"needs the GLUE folder {glue} (PIPELINE_SHARED_DATA points elsewhere)")
    models = {"export": export, "scratch": export}
    if "minilm" in arms:
        from pipeline.common.errors import PipelineError
        from pipeline.models.reference_model import reference_encoder_folder
        try:
            models["minilm"] = reference_encoder_folder()
        except PipelineError as error:
            p.error(f"--arms minilm: {error}")
    out = harness.work_dir("glue-table", a.out)
    # What decides every cell in --out: the data caps, the recipe, the sweeps and the export's content.
    claim_out(out, {"train_examples": a.train_examples, "epochs": a.epochs, "seeds": a.seeds, "sweep": a.sweep,
                    "minilm_sweep": a.minilm_sweep, "export": str(export),
                    "export_fingerprint": model_fingerprint(str(export))})
    with STUDY.record() as rec:
        env = harness.cpu_env(1)
        glue = harness.glue_sample(glue, out / "glue", dict.fromkeys(TASKS, a.train_examples), spread=True)
        for task in TASKS:  # seconds each: every row has its baseline, whichever cells this run trains
            token_counts(a, out, glue, task)
        cells = sorted([(task, arm) for task in tasks for arm in arms
                        if finetune_result(out / f"{task}-{arm}" / "metrics.json") is None],
                       key=lambda cell: -RELATIVE_COST[cell[1]])
        with ThreadPoolExecutor(2) as pool:  # cells side by side, one thread each: both cores
            list(pool.map(lambda cell: finetune_cell(a, out, glue, *cell, models[cell[1]], env), cells))
        rows = table_rows(out)
        rec.table(f"GLUE dev, median [min–max] over seeds {a.seeds}; {a.train_examples:,} training examples of each "
                  f"task spread evenly over its file, {a.epochs} epochs, batch 32; each arm's learning rate chosen on "
                  f"a held-out 10% of them (export and scratch: {' '.join(a.sweep)}; "
                  f"MiniLM: {' '.join(a.minilm_sweep)}); "
                  f"export: {export.relative_to(harness.ROOT) if export.is_relative_to(harness.ROOT) else export}",
                  rows)


if __name__ == "__main__":
    main()
