"""MLflow as a metrics sink: best-effort, never in the step's way, and the same run again on resume.

The run is created (or re-opened) when the sink opens. After that every call — metrics, params,
tags, artifacts, the final status — goes into one ordered, bounded buffer that a background
thread sends; a training step only appends to a list. Consecutive metrics go out in batches of up
to 1,000.

A lost tracking server (killed, restarted, a network cut) stops nothing: the thread prints one
warning naming the server, keeps the buffer (up to `buffer_limit` metrics, the oldest dropped
beyond that) and retries every `retry_seconds`; when the server answers again, what was buffered
is sent in order and one line says so. `flush` waits (a bounded time) only while the server
answers. `close` waits up to `close_seconds` for the buffer to drain; whatever could not be sent
is named (count, keys, steps) on the screen and in the run folder's `tracking.json`, and every
metric is in `metrics.jsonl` anyway.

If the server cannot be reached when the sink opens, there is no run to log to: one warning, and
the sink is off for this run (metrics.jsonl keeps everything). The run id is kept in
`tracking.json`, so a resumed (or requeued) run goes on logging to the same run.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.common.atomic_files import write_json_atomic
from pipeline.tracking.metrics import MetricsSink, Number
from pipeline.tracking.sqlite_store import start_from_template

MAX_BATCH = 1000
"""Metrics per `log_batch` request (MLflow's own limit)."""


def default_tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI, else MLflow's own default: `mlflow.db` (sqlite) in the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def permanent_failure(err: Exception) -> bool:
    """True when the store refused the request itself (4xx: bad value, run deleted): retrying cannot help."""
    from mlflow.exceptions import MlflowException

    return isinstance(err, MlflowException) and 400 <= err.get_http_status_code() < 500


class MlflowSink(MetricsSink):
    """One MLflow run, created or re-opened; everything after that is sent by a background thread."""

    def __init__(self, uri: str | None, experiment: str, run_name: str | None, state_file: Path | None,
                 flush_seconds: float = 10.0, tags: Mapping[str, str] | None = None,
                 params: Mapping[str, Any] | None = None, *, buffer_limit: int = 1_000_000,
                 retry_seconds: float = 2.0, close_seconds: float = 30.0):
        """`state_file`: where the run id is kept so a rerun reopens the run; None: always a new run.

        `tags` are set on every (re)start: a resume may run on another world size. `params` are
        logged when the run is created only; MLflow refuses to change a logged param.
        `flush_seconds` bounds how long `flush` waits for a live server.
        """
        self.uri = uri or default_tracking_uri()
        self.state_file = Path(state_file) if state_file else None
        self.flush_seconds = flush_seconds
        self.buffer_limit, self.retry_seconds, self.close_seconds = buffer_limit, retry_seconds, close_seconds
        self.run_id: str | None = None
        self.reopened = False
        self.started = False
        self.outage_since: float | None = None  # monotonic time the server stopped answering; None: it answers
        self.sent_after_outage = 0  # metrics buffered during outages, sent when the server was back
        self.dropped: list = []  # metrics dropped: the buffer was full, or the store refused them
        self._queue: deque[tuple[str, Any]] = deque()  # ("metrics", [Metric]) or ("call", (name, args))
        self._buffered = 0  # metrics in the queue
        self._in_flight: set[int] = set()  # ids of the queue's first items, which the thread is sending
        self._closing = False  # close() was called: nothing more is taken
        self._abandon = False  # close() has waited long enough: the thread stops retrying
        self._cond = threading.Condition()
        # Fail fast on an unreachable server (the thread retries by itself) instead of MLflow's minutes of retries.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)  # its retry warnings name no run
        try:
            self._start(experiment, run_name, dict(tags or {}))
        except Exception as err:  # noqa: BLE001 - any tracking failure must leave training running
            print(f"warning: MLflow tracking at {self.uri} is off for this run (start failed: {type(err).__name__}: "
                  f"{str(err)[:200]}); training goes on, metrics stay in metrics.jsonl", file=sys.stderr)
            return
        self.started = True
        if not self.reopened and params:
            self.log_params(params)
        self._thread = threading.Thread(target=self._send_loop, name="mlflow-sink", daemon=True)
        self._thread.start()

    @property
    def enabled(self) -> bool:
        """True while the run is open and its server answers (the model store logs only then)."""
        return self.started and not self._closing and self.outage_since is None

    def _start(self, experiment: str, run_name: str | None, tags: dict[str, str]) -> None:
        from mlflow.tracking import MlflowClient

        start_from_template(self.uri)  # a new sqlite store: copied, not migrated (seconds per run)
        self.client = MlflowClient(self.uri)
        previous = json.loads(self.state_file.read_text()) if self.state_file and self.state_file.exists() else {}
        if previous.get("uri") == self.uri and previous.get("run_id"):
            self.run_id = previous["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            self.reopened = True
            self.client.log_batch(self.run_id, (), (), self._tags(tags))
            return
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(
            experiment, artifact_location=artifact_root(self.uri))
        self.run_id = self.client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
        if self.state_file:
            write_json_atomic(self.state_file, {"uri": self.uri, "run_id": self.run_id, "experiment": experiment})

    # --- what the trainer calls: append to the buffer, never wait on the server ----------------

    def _put(self, kind: str, payload: Any, metrics: int = 0) -> None:
        if not self.started or self._closing:
            return
        with self._cond:
            self._queue.append((kind, payload))
            self._buffered += metrics
            while self._buffered > self.buffer_limit:  # drop the oldest metrics not being sent; keep calls
                index = next((i for i, item in enumerate(self._queue)
                              if item[0] == "metrics" and id(item) not in self._in_flight), None)
                if index is None:
                    break
                _, old = self._queue[index]
                del self._queue[index]
                self._buffered -= len(old)
                self.dropped += old
            self._cond.notify_all()

    def log(self, metrics: Mapping[str, Number], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None]
        if items:
            self._put("metrics", items, len(items))

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], json.dumps(v) if not isinstance(v, str) else v)  # JSON keeps None/true readable
                 for k, v in params.items()]
        for i in range(0, len(items), 100):
            self._put("call", ("log_batch", (self.run_id, (), items[i: i + 100])))

    @staticmethod
    def _tags(tags: Mapping[str, str]) -> list:
        from mlflow.entities import RunTag

        return [RunTag(k, str(v)) for k, v in tags.items()]

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._put("call", ("log_batch", (self.run_id, (), (), self._tags(tags))))

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        method = "log_artifacts" if Path(path).is_dir() else "log_artifact"
        self._put("call", (method, (self.run_id, str(path), artifact_path)))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the buffer is sent, for at most `timeout` (default `flush_seconds`), and only while the
        server answers; True when everything logged so far is stored."""
        deadline = time.monotonic() + (self.flush_seconds if timeout is None else timeout)
        with self._cond:
            while self._queue and self.outage_since is None and self.started and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return not self._queue

    def close(self, status: str = "FINISHED") -> None:
        """Send the final status after everything else; wait up to `close_seconds`; name what could not be sent."""
        if not self.started or self._closing:
            return  # a second close (an error path after a normal one) does nothing
        self._put("call", ("set_terminated", (self.run_id, status)))
        deadline = time.monotonic() + self.close_seconds
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while self._queue and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            self._abandon = True
            self._cond.notify_all()
        self._thread.join(timeout=float(os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"]) + 5)
        with self._cond:
            unsent = list(self._queue)  # a request still in flight counts as missing
        self._report_missing(unsent, status)

    # --- the background thread -------------------------------------------------------------------

    def _next(self) -> list[tuple[str, Any]] | None:
        """The next request's items (a run of metrics up to MAX_BATCH, or one call), left in the queue."""
        with self._cond:
            while not self._queue:
                if self._closing:
                    return None
                self._cond.wait()
            if self._abandon:
                return None
            kind, payload = self._queue[0]
            if kind == "call":
                items = [self._queue[0]]
            else:
                items, count = [], 0
                for item in self._queue:
                    if item[0] != "metrics" or (items and count + len(item[1]) > MAX_BATCH):
                        break
                    items.append(item)
                    count += len(item[1])
            self._in_flight = {id(item) for item in items}
            return items

    def _send(self, items: list[tuple[str, Any]]) -> None:
        if items[0][0] == "call":
            name, args = items[0][1]
            getattr(self.client, name)(*args)
        else:
            metrics = [m for _, batch in items for m in batch]
            self.client.log_batch(self.run_id, metrics, (), (), True)

    def _done(self, items: list[tuple[str, Any]], dropped: bool) -> None:
        """Take the items just sent (or refused) off the front of the queue: only this thread removes the front."""
        with self._cond:
            for _ in items:
                _, payload = item = self._queue.popleft()
                if item[0] == "metrics":
                    self._buffered -= len(payload)
                    if dropped:
                        self.dropped += payload
            self._in_flight = set()
            self._cond.notify_all()

    def _send_loop(self) -> None:
        while (items := self._next()) is not None:
            try:
                self._send(items)
            except Exception as err:  # noqa: BLE001 - the thread must outlive any failure
                if permanent_failure(err):
                    print(f"warning: MLflow at {self.uri} refused a request ({type(err).__name__}: "
                          f"{str(err)[:200]}); skipped", file=sys.stderr)
                    self._done(items, dropped=True)
                    continue
                with self._cond:
                    self._in_flight = set()
                    if self.outage_since is None:
                        self.outage_since = time.monotonic()
                        print(f"warning: MLflow tracking server {self.uri} is unreachable ({type(err).__name__}: "
                              f"{str(err)[:160]}); training goes on, metrics.jsonl keeps every metric and the "
                              f"rest are buffered and sent when the server is back", file=sys.stderr, flush=True)
                    self._cond.notify_all()
                    if self._abandon:
                        return  # close() names what is left
                    self._cond.wait(self.retry_seconds)
                continue
            was_out, backlog = self.outage_since, self._buffered
            self._done(items, dropped=False)
            if was_out is not None:
                with self._cond:
                    self.outage_since = None
                    self.sent_after_outage += backlog
                    self._cond.notify_all()
                print(f"MLflow tracking server {self.uri} is reachable again after {time.monotonic() - was_out:.0f} s; "
                      f"sending the {backlog} metrics buffered meanwhile", file=sys.stderr, flush=True)

    def _report_missing(self, unsent: list[tuple[str, Any]], status: str) -> None:
        """Name what MLflow lacks (on the screen and in tracking.json); nothing when it has everything."""
        metrics = self.dropped + [m for kind, batch in unsent if kind == "metrics" for m in batch]
        calls = [payload[0] for kind, payload in unsent if kind == "call"]
        if not metrics and not calls:
            return
        steps = sorted({m.step for m in metrics})
        missing = {"metrics": len(metrics), "keys": sorted({m.key for m in metrics}),
                   "steps": [steps[0], steps[-1]] if steps else [], "calls": calls}
        print(f"warning: MLflow run {self.run_id} at {self.uri} is missing {len(metrics)} metrics "
              f"(steps {missing['steps'][0] if steps else '-'}-{missing['steps'][-1] if steps else '-'}) and "
              f"{len(calls)} other calls ({', '.join(sorted(set(calls))) or 'none'}); metrics.jsonl has every metric",
              file=sys.stderr)
        if self.state_file and self.state_file.exists():
            state = json.loads(self.state_file.read_text())
            write_json_atomic(self.state_file, {**state, "missing": missing, "final_status": status})


def artifact_root(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a sqlite store (`<its folder>/mlruns`), so a run's
    store and its artifacts stay together whatever the working directory; None (MLflow's default) otherwise."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlruns").as_uri()
