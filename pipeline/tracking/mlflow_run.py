"""Metrics out of rank 0: a local JSONL that is always written, and MLflow when it is reachable.

MLflow failures never stop training: the first failed call prints one warning, tracking turns
off for the rest of the run, and the JSONL keeps every metric. The MLflow run id is kept in
`<output_dir>/tracking.json`, so a resumed (or requeued) run goes on logging to the same run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from pipeline.common.atomic_files import write_json_atomic, write_text_atomic


def default_tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI, else MLflow's own default: `mlflow.db` (sqlite) in the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class MetricsJsonl:
    """`metrics.jsonl`: one JSON object per logged step or evaluation, appended and flushed."""

    def __init__(self, path: Path, resume_step: int = 0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._truncate_after(resume_step)
        self._file = open(self.path, "a", encoding="utf-8")

    def _truncate_after(self, step: int) -> None:
        """Drop records of steps after the checkpoint we resume from: they are about to be redone."""
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps({**record, "time": round(time.time(), 3)}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class MlflowRun:
    """One MLflow run, created or re-opened; every call is best-effort."""

    def __init__(self, uri: str | None, experiment: str, run_name: str | None, state_file: Path | None,
                 flush_seconds: float = 10.0, tags: dict[str, str] | None = None):
        """`state_file`: where the run id is kept so a rerun reopens the run; None: always a new run."""
        self.uri = uri or default_tracking_uri()
        self.state_file = Path(state_file) if state_file else None
        self.tags = tags or {}
        self.flush_seconds = flush_seconds
        self.enabled = True
        self.run_id: str | None = None
        self.reopened = False
        self._pending: list = []
        self._last_flush = time.monotonic()
        # Fail fast on an unreachable server instead of MLflow's minutes of retries.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self._guard("start", self._start, experiment, run_name)

    def _guard(self, what: str, fn, *args):
        if not self.enabled:
            return None
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001 - any tracking failure must leave training running
            self.enabled = False
            warnings.warn(f"MLflow ({self.uri}) failed at {what}: {type(err).__name__}: {str(err)[:300]}; "
                          f"training goes on, metrics stay in metrics.jsonl", stacklevel=2)
            print(f"warning: MLflow tracking at {self.uri} is off for this run ({what} failed: {type(err).__name__})",
                  file=sys.stderr)
            return None

    def _start(self, experiment: str, run_name: str | None) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(self.uri)
        previous = json.loads(self.state_file.read_text()) if self.state_file and self.state_file.exists() else {}
        if previous.get("uri") == self.uri and previous.get("run_id"):
            self.run_id = previous["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            self.reopened = True
            return
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name, tags=self.tags).info.run_id
        if self.state_file:
            write_json_atomic(self.state_file, {"uri": self.uri, "run_id": self.run_id, "experiment": experiment})

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], json.dumps(v) if not isinstance(v, str) else v)  # JSON keeps None/true readable
                 for k, v in params.items()]
        for i in range(0, len(items), 100):
            self._guard("log params", self.client.log_batch, self.run_id, (), items[i: i + 100])

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)) for k, v in tags.items()]
        self._guard("set tags", self.client.log_batch, self.run_id, (), (), items)

    def log_metrics(self, metrics: dict[str, float], step: int, flush: bool = False) -> None:
        from mlflow.entities import Metric

        if not self.enabled:
            return
        now = int(time.time() * 1000)
        self._pending += [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None]
        if flush or time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        while self.enabled and self._pending:
            batch, self._pending = self._pending[:1000], self._pending[1000:]
            self._guard("log metrics", self.client.log_batch, self.run_id, batch)
        self._last_flush = time.monotonic()

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if Path(path).is_dir():
            self._guard("log artifacts", self.client.log_artifacts, self.run_id, str(path), artifact_path)
        else:
            self._guard("log artifact", self.client.log_artifact, self.run_id, str(path), artifact_path)

    def finish(self, status: str = "FINISHED") -> None:
        self.flush()
        self._guard("finish", self.client.set_terminated, self.run_id, status)
