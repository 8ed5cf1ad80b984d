"""MLflow as a metrics sink: best-effort, asynchronous, and the same run again on resume.

Metrics go out with MLflow's own asynchronous logging (`log_batch(..., synchronous=False)`): a
background thread sends them and merges what queued meanwhile into batches of up to 1,000, so a
training step never waits on the store. Every `flush_seconds` (and at every checkpoint,
evaluation and the end) the sink waits for what it sent, which is when a failure shows up.

MLflow failures never stop training: the first failed call prints one warning, the sink turns
off for the rest of the run, and the JSONL sink beside it keeps every metric. The run id is kept
in the run folder's `tracking.json`, so a resumed (or requeued) run goes on logging to it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.common.atomic_files import write_json_atomic
from pipeline.tracking.metrics import MetricsSink, Number


def default_tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI, else MLflow's own default: `mlflow.db` (sqlite) in the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


class MlflowSink(MetricsSink):
    """One MLflow run, created or re-opened; every call is best-effort."""

    def __init__(self, uri: str | None, experiment: str, run_name: str | None, state_file: Path | None,
                 flush_seconds: float = 10.0, tags: Mapping[str, str] | None = None,
                 params: Mapping[str, Any] | None = None):
        """`state_file`: where the run id is kept so a rerun reopens the run; None: always a new run.

        `tags` are set on every (re)start: a resume may run on another world size. `params` are
        logged when the run is created only; MLflow refuses to change a logged param.
        """
        self.uri = uri or default_tracking_uri()
        self.state_file = Path(state_file) if state_file else None
        self.flush_seconds = flush_seconds
        self.enabled = True
        self.run_id: str | None = None
        self.reopened = False
        self._in_flight: list = []  # MLflow's RunOperations futures not yet waited for
        self._last_flush = time.monotonic()
        # Fail fast on an unreachable server instead of MLflow's minutes of retries.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self._guard("start", self._start, experiment, run_name, dict(tags or {}))
        if self.run_id and not self.reopened and params:
            self.log_params(params)

    def _guard(self, what: str, fn, *args):
        """`fn(*args)`, or None once tracking is off; `fn` may name a method of the MLflow client."""
        if not self.enabled:
            return None
        try:
            return (getattr(self.client, fn) if isinstance(fn, str) else fn)(*args)
        except Exception as err:  # noqa: BLE001 - any tracking failure must leave training running
            self.enabled = False
            self._in_flight = []
            warnings.warn(f"MLflow ({self.uri}) failed at {what}: {type(err).__name__}: {str(err)[:300]}; "
                          f"training goes on, metrics stay in metrics.jsonl", stacklevel=2)
            print(f"warning: MLflow tracking at {self.uri} is off for this run ({what} failed: {type(err).__name__})",
                  file=sys.stderr)
            return None

    def _start(self, experiment: str, run_name: str | None, tags: dict[str, str]) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(self.uri)
        previous = json.loads(self.state_file.read_text()) if self.state_file and self.state_file.exists() else {}
        if previous.get("uri") == self.uri and previous.get("run_id"):
            self.run_id = previous["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            self.reopened = True
            self.set_tags(tags)
            return
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
        if self.state_file:
            write_json_atomic(self.state_file, {"uri": self.uri, "run_id": self.run_id, "experiment": experiment})

    def log(self, metrics: Mapping[str, Number], step: int) -> None:
        from mlflow.entities import Metric

        if not self.enabled:
            return
        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None]
        operations = self._guard("log metrics", "log_batch", self.run_id, items, (), (), False)
        if operations is not None:
            self._in_flight.append(operations)
        if time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        """Wait for the metrics sent so far; the first failure turns the sink off with one warning."""
        while self.enabled and self._in_flight:
            self._guard("log metrics", self._in_flight.pop(0).wait)
        self._last_flush = time.monotonic()

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], json.dumps(v) if not isinstance(v, str) else v)  # JSON keeps None/true readable
                 for k, v in params.items()]
        for i in range(0, len(items), 100):
            self._guard("log params", "log_batch", self.run_id, (), items[i: i + 100])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)) for k, v in tags.items()]
        self._guard("set tags", "log_batch", self.run_id, (), (), items)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if Path(path).is_dir():
            self._guard("log artifacts", "log_artifacts", self.run_id, str(path), artifact_path)
        else:
            self._guard("log artifact", "log_artifact", self.run_id, str(path), artifact_path)

    def close(self, status: str = "FINISHED") -> None:
        self.flush()
        self._guard("finish", "set_terminated", self.run_id, status)
        self.enabled = False  # a second close (an error path after a normal one) does nothing
