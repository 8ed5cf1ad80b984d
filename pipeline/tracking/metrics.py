"""The metrics interface every stage logs through: `log(metrics, step)` and `close()`.

A trainer holds one `MetricsSink` and never asks which rank it is on or whether MLflow is up:
rank 0 gets the JSONL file and MLflow, other ranks a `MetricsSink` that does nothing; the factory
that chooses, `sinks.open_metrics`, stands outside this interface and its MLflow sink. Keys are
namespaced (`train/loss`, `eval/mlm_loss`, `best/accuracy`).

`event` records what is not a metric (a resume, a checkpoint, a stop) in the local log only.
`log_params`, `set_tags` and `log_artifact` reach the tracking store; a sink that has none
ignores them, so a new backend (or `log_model`) is one more method on one class.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.common.atomic_files import reporting_disk_full, write_text_atomic

Number = float | int | None


class MetricsSink:
    """Where metrics go; this base class drops everything (the sink of ranks other than 0)."""

    run_id: str | None = None
    """The tracking store's id of this run, when there is one (a parent for child runs)."""

    def log(self, metrics: Mapping[str, Number], step: int) -> None:
        """Record `metrics` at `step`; None values are left out."""

    def event(self, record: Mapping[str, Any], step: int) -> None:
        """Record a fact that is not a metric (local log only)."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Record the run's parameters (the flattened config)."""

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set searchable tags on the run."""

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Attach a file or folder to the run."""

    def flush(self) -> None:
        """Make sure what was logged so far is stored (at checkpoints and evaluations)."""

    def close(self, status: str = "FINISHED") -> None:
        """Flush and end the run (`FINISHED`, `KILLED` or `FAILED`)."""


class JsonlSink(MetricsSink):
    """`metrics.jsonl`: one JSON object per logged step, evaluation or event, appended and flushed.

    On a resume the records of steps after the checkpoint are dropped first: they are about to
    be redone, and each step must appear once.
    """

    def __init__(self, path: Path, resume_step: int = 0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._truncate_after(resume_step)
        self._file = open(self.path, "a", encoding="utf-8")

    def _truncate_after(self, step: int) -> None:
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))

    def _write(self, record: Mapping[str, Any]) -> None:
        with reporting_disk_full(self.path):  # a line cut short by a full disk is dropped on resume
            self._file.write(json.dumps({**record, "time": round(time.time(), 3)}) + "\n")
            self._file.flush()

    def log(self, metrics: Mapping[str, Number], step: int) -> None:
        self._write({"step": step, **{k: v for k, v in metrics.items() if v is not None}})

    def event(self, record: Mapping[str, Any], step: int) -> None:
        self._write({"step": step, **record})

    def close(self, status: str = "FINISHED") -> None:
        if not self._file.closed:
            self._file.close()


class FanOut(MetricsSink):
    """Every call goes to each sink in turn (JSONL first: it must hold everything whatever MLflow does)."""

    def __init__(self, *sinks: MetricsSink):
        self.sinks = sinks

    @property
    def run_id(self) -> str | None:  # type: ignore[override]
        return next((s.run_id for s in self.sinks if s.run_id), None)

    def log(self, metrics, step):
        for s in self.sinks:
            s.log(metrics, step)

    def event(self, record, step):
        for s in self.sinks:
            s.event(record, step)

    def log_params(self, params):
        for s in self.sinks:
            s.log_params(params)

    def set_tags(self, tags):
        for s in self.sinks:
            s.set_tags(tags)

    def log_artifact(self, path, artifact_path=None):
        for s in self.sinks:
            s.log_artifact(path, artifact_path)

    def flush(self):
        for s in self.sinks:
            s.flush()

    def close(self, status="FINISHED"):
        for s in self.sinks:
            s.close(status)


def file_metric_name(path: str | Path) -> str:
    """An evaluation file's name in its metrics (`probe/retrieval/<name>/…`, roberta-embed-eval's records): its
    file name before the first '.'."""
    return Path(path).name.split(".")[0]
