"""A study's results table, laid out like the paper's: one row per arm, validation perplexity, task medians.

Each arm's figures are read from what its stages wrote: the last evaluation in the pretraining
run's `metrics.jsonl`, and each requested seed's `complete.json` (so the medians are over exactly
the seeds asked for, whatever earlier runs did). `direction_checks` compares the arms' order on
each measure with the order the paper found.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from pipeline.ablation.plan import ArmPlan
from pipeline.common.atomic_files import write_text_atomic
from pipeline.common.run_layout import ArmLayout
from pipeline.tracking.finetune_report import finetune_result


@dataclass(frozen=True)
class TaskScore:
    metric: str
    """The task's main metric (the one that picks the best epoch)."""
    median: float
    seeds: int


@dataclass
class ArmResult:
    arm: str
    description: str
    steps: int
    global_batch: int
    tokens: int
    epochs: float | None
    """Passes over the shards' train split (static and dynamic masks differ only from the second on)."""
    val_mlm_loss: float | None
    val_perplexity: float | None
    tasks: dict[str, TaskScore] = field(default_factory=dict)
    parameters: int | None = None
    """Parameters of the arm's exported MLM model (tied weights once), None before its export exists."""


def export_parameters(export: Path) -> int | None:
    """Parameters in an HF export's safetensors files, read from their headers (tied weights are saved once)."""
    files = sorted(export.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        with open(path, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return total


def last_evaluation(metrics_jsonl: Path) -> dict[str, float]:
    """The last record of `metrics.jsonl` that holds `eval/mlm_loss` (empty when there is none)."""
    last: dict[str, float] = {}
    if metrics_jsonl.exists():
        for line in metrics_jsonl.read_text().splitlines():
            record = json.loads(line) if line.strip() else {}
            if "eval/mlm_loss" in record:
                last = record
    return last


def task_score(finetune_root: ArmLayout, task: str, seeds: list[int]) -> TaskScore | None:
    """Median of the task's main metric over `seeds`; None until every seed has finished."""
    layout = finetune_root.finetune(task)
    done = [layout.seed(s).complete for s in seeds]
    report = finetune_result(layout.metrics) if all(p.exists() for p in done) else None
    if report is None:
        return None
    metric = report.metric  # the task's main metric on dev (under the protocol the slice chose the epochs)
    values = [json.loads(p.read_text())["metrics"][metric] for p in done]
    return TaskScore(metric, statistics.median(values), len(values))


def arm_result(plan: ArmPlan, layout: ArmLayout, tasks: list[str], seeds: list[int],
               epochs: float | None = None) -> ArmResult:
    evaluation = last_evaluation(layout.pretrain.metrics)
    scores = {task: score for task in tasks if (score := task_score(layout, task, seeds)) is not None}
    return ArmResult(plan.name, plan.description, plan.steps, plan.global_batch, plan.tokens, epochs,
                     evaluation.get("eval/mlm_loss"), evaluation.get("eval/perplexity"), scores,
                     export_parameters(layout.pretrain.export))


def _columns(results: list[ArmResult], tasks: list[str]) -> list[str]:
    metrics = {t: next((r.tasks[t].metric for r in results if t in r.tasks), "score") for t in tasks}
    return ["arm", "description", "parameters", "steps", "global batch", "tokens", "epochs", "val MLM loss",
            "val perplexity",
            *(c for t in tasks for c in (f"{t} {metrics[t]} (median)", f"{t} seeds"))]


def _row(result: ArmResult, tasks: list[str], fmt) -> list:
    cells = [result.arm, result.description, "" if result.parameters is None else result.parameters, result.steps,
             result.global_batch, result.tokens,
             fmt(result.epochs, 2), fmt(result.val_mlm_loss, 4), fmt(result.val_perplexity, 2)]
    for task in tasks:
        score = result.tasks.get(task)
        cells += [fmt(score.median if score else None, 4), score.seeds if score else ""]
    return cells


def results_csv(results: list[ArmResult], tasks: list[str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_columns(results, tasks))
    for result in results:
        writer.writerow(_row(result, tasks, lambda v, _: "" if v is None else v))
    return out.getvalue()


def direction_checks(results: list[ArmResult], tasks: list[str], paper_order: list[str]) -> list[str]:
    """One line per measure: this run's order of the paper's arms, and whether it is the paper's order."""
    by_name = {r.arm: r for r in results}
    arms = [by_name[a] for a in paper_order if a in by_name]
    if len(arms) < 2:
        return []
    measures = [("val perplexity", lambda r: r.val_perplexity, False)]
    measures += [(f"{t} {next(r.tasks[t].metric for r in arms if t in r.tasks)}", lambda r, t=t: (
        r.tasks[t].median if t in r.tasks else None), True) for t in tasks if any(t in r.tasks for r in arms)]
    lines = []
    for label, value, higher_better in measures:
        if any(value(r) is None for r in arms):
            lines.append(f"- {label}: not measured for every arm yet")
            continue
        ranked = sorted(arms, key=lambda r: -value(r) if higher_better else value(r))
        # Best first; "=" between arms whose values are equal, so a tie never reads as an order.
        shown = f"{ranked[0].arm} ({value(ranked[0]):.4g})" + "".join(
            f" {'=' if value(b) == value(a) else '>'} {b.arm} ({value(b):.4g})" for a, b in pairwise(ranked))
        paper = " > ".join(r.arm for r in arms)
        if len({value(r) for r in arms}) < len(arms):
            verdict = f"some arms tie, so no direction to compare (paper: {paper})"
        elif [r.arm for r in ranked] == [r.arm for r in arms]:
            verdict = "same direction as the paper"
        else:
            verdict = f"differs from the paper ({paper})"
        lines.append(f"- {label} ({'higher' if higher_better else 'lower'} is better; best first): {shown}: {verdict}")
    return lines


def results_markdown(title: str, setup: list[str], results: list[ArmResult], tasks: list[str], paper: str,
                     paper_order: list[str], curves: str | None) -> str:
    """The study's `results.md`: the setup, the table, the paper's finding beside this run's, the curves."""
    def fmt(value, digits):
        return "–" if value is None else f"{value:.{digits}f}"

    columns = _columns(results, tasks)
    lines = [f"# {title}", "", *(f"- {s}" for s in setup), "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c) for c in _row(r, tasks, fmt)) + " |" for r in results]
    lines += ["", "Scores are medians over the seeds on each task's dev set; the validation MLM loss and "
              "perplexity come from each arm's last evaluation on its shards' validation split (the same held-out "
              "documents for every packing mode, framed as that mode frames them)."]
    if paper:
        lines += ["", "## Against the paper", "", f"Paper: {paper}", "", "This corpus and budget:",
                  *direction_checks(results, tasks, paper_order)]
    if curves:
        lines += ["", f"![loss curves]({curves})"]
    return "\n".join(lines) + "\n"


def write_results(md_path: Path, csv_path: Path, markdown: str, csv_text: str) -> None:
    write_text_atomic(csv_path, csv_text)
    write_text_atomic(md_path, markdown)
