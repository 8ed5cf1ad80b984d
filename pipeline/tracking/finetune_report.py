"""A fine-tuning output folder's `metrics.json`, read: the main metric's median, the chosen setting, the label curve.

The trainer summarises each of a task's metrics as its median with `_mean` and `_std` beside it, and
names the main one (`metric`; the one a sweep selects by and a best epoch is chosen by).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class CurvePoint:
    """One label count of one arm: the median over seeds of the main metric and its min–max."""

    labels_per_class: int | str
    examples: int | None
    median: float
    low: float
    high: float

    @property
    def spread(self) -> float:
        return self.high - self.low


@dataclass(frozen=True)
class FinetuneResult:
    """One fine-tuning output folder, from its `metrics.json`; `curve` ends with the full split ("all")."""

    metric: str
    median: float
    seeds: int
    chosen: dict = field(default_factory=dict)
    curve: tuple[CurvePoint, ...] = ()


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def main_metric(report: dict) -> str | None:
    """The task's main metric in a `metrics.json`; None when it holds no summarised metric."""
    # A file from before `metric` was written: a sweep's selection metric (the main one), else the first one.
    metric = report.get("metric") or (report.get("selection") or {}).get("metric")
    if isinstance(report.get(metric), int | float):
        return metric
    return next((k for k in report if f"{k}_mean" in report and isinstance(report[k], int | float)), None)


def finetune_result(metrics_json: Path) -> FinetuneResult | None:
    """The arm's headline (its main metric's median), chosen setting and label curve."""
    report = read_json(metrics_json)
    if not isinstance(report, dict):
        return None
    metric = main_metric(report)
    if metric is None:
        return None
    curve = tuple(CurvePoint(p["labels_per_class"], p["examples"], p["median"], p["min"], p["max"])
                  for p in report.get("label_curve") or [])
    if not curve:  # no --labels-per-class: the full split alone, its size not recorded
        values = [s[metric] for s in report.get("per_seed") or [] if isinstance(s.get(metric), int | float)]
        curve = (CurvePoint("all", None, float(report[metric]), min(values, default=report[metric]),
                            max(values, default=report[metric])),)
    return FinetuneResult(metric, float(report[metric]), len(report.get("seeds") or report.get("per_seed") or []),
                     dict(report.get("chosen_setting") or {}), curve)
