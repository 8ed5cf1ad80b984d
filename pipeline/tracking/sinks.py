"""Which metrics sink a rank gets: the one factory that knows every sink.

`metrics.py` defines the interface and the sinks that need nothing (JSONL, fan-out, the null sink);
`mlflow_run.py` the MLflow sink, which implements that interface. This module chooses between them,
so neither imports the other's side.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.tracking.metrics import FanOut, JsonlSink, MetricsSink
from pipeline.tracking.mlflow_run import MlflowSink


def open_metrics(is_main: bool, *, jsonl: Path | None = None, resume_step: int = 0, tracking=None,
                 run_name: str | None = None, state_file: Path | None = None,
                 tags: Mapping[str, str] | None = None, params: Mapping[str, Any] | None = None) -> MetricsSink:
    """The sink for this rank: nothing off rank 0; else `jsonl` and, when `tracking.enabled`, MLflow.

    `tracking`: a `TrackingConfig`; `state_file`: where MLflow's run id is kept so a rerun logs
    to the same run (None: a new run each time); `tags` are set on every start, `params` when the
    MLflow run is created.
    """
    if not is_main:
        return MetricsSink()
    sinks: list[MetricsSink] = []
    if jsonl is not None:
        sinks.append(JsonlSink(jsonl, resume_step))
    if tracking is not None and tracking.enabled:
        sinks.append(MlflowSink(tracking.uri, tracking.experiment, run_name, state_file, tracking.flush_seconds,
                                tags, params))
    if len(sinks) < 2:
        return sinks[0] if sinks else MetricsSink()
    return FanOut(*sinks)
