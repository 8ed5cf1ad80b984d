"""A lost tracking server: training goes on, one warning, metrics.jsonl complete, MLflow catches up.

The fast tests drive the MLflow sink against a client that fails on demand; the slow one kills a
real `mlflow server` during a pretraining run and starts it again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import PYTHON, ROOT, tiny_pretrain_config

from pipeline.common.processes.topology import free_port
from pipeline.common.run_layout import PretrainLayout


class FlakyClient:
    """Stands in for MlflowClient: stores what it is sent, or raises while `down`."""

    def __init__(self):
        self.down = False
        self.metrics: list = []
        self.calls: list[str] = []

    def _check(self):
        if self.down:
            time.sleep(0.01)
            raise ConnectionError("Connection refused")

    def log_batch(self, run_id, metrics=(), params=(), tags=(), synchronous=None):
        self._check()
        self.metrics += metrics
        self.calls += ["log_batch"] * bool(params or tags)

    def set_terminated(self, run_id, status):
        self._check()
        self.calls.append(f"set_terminated {status}")


def flaky_sink(monkeypatch, tmp_path, **options):
    from pipeline.tracking import mlflow_run

    client = FlakyClient()

    def start(self, experiment, run_name, tags):
        self.client, self.run_id = client, "run-1"
        write_state = {"uri": self.uri, "run_id": "run-1", "experiment": experiment}
        self.state_file.write_text(json.dumps(write_state))

    monkeypatch.setattr(mlflow_run.MlflowSink, "_start", start)
    sink = mlflow_run.MlflowSink("http://127.0.0.1:1", "e", "r", tmp_path / "tracking.json", flush_seconds=5.0,
                                 retry_seconds=0.05, **options)
    return sink, client


def test_metrics_logged_while_the_server_is_down_are_sent_when_it_is_back(monkeypatch, tmp_path, capsys):
    sink, client = flaky_sink(monkeypatch, tmp_path)
    sink.log({"train/loss": 1.0}, 1)
    assert sink.flush()
    client.down = True
    started = time.monotonic()
    for step in range(2, 200):
        sink.log({"train/loss": 1.0 / step, "train/lr": 0.1}, step)
    sink.flush()  # returns at once while the server is down
    assert time.monotonic() - started < 1.0
    time.sleep(0.3)
    client.down = False
    sink.log({"train/loss": 0.0}, 200)
    sink.close()
    assert sorted({m.step for m in client.metrics if m.key == "train/loss"}) == list(range(1, 201))
    assert client.calls[-1] == "set_terminated FINISHED"
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "MLflow tracking server http://127.0.0.1:1 is unreachable" in err
    assert re.search(r"is reachable again after \d+ s; sending the \d+ metrics buffered meanwhile", err)
    assert "missing" not in json.loads((tmp_path / "tracking.json").read_text())


def test_what_never_reached_the_server_is_named_at_close(monkeypatch, tmp_path, capsys):
    sink, client = flaky_sink(monkeypatch, tmp_path, buffer_limit=20, close_seconds=0.3)
    sink.log({"train/loss": 1.0}, 1)
    assert sink.flush()
    client.down = True
    for step in range(2, 31):  # 29 metrics: the buffer keeps the newest 20
        sink.log({"train/loss": 1.0 / step}, step)
    sink.close()
    missing = json.loads((tmp_path / "tracking.json").read_text())["missing"]
    assert missing == {"metrics": 29, "keys": ["train/loss"], "steps": [2, 30], "calls": ["set_terminated"]}
    err = capsys.readouterr().err
    assert "MLflow run run-1 at http://127.0.0.1:1 is missing 29 metrics (steps 2-30)" in err


# --- a real server --------------------------------------------------------------------------------

STEPS = 300  # on a quiet machine a step takes ~70 ms: the restart (~12 s) spans ~170 of them
SERVER_ENV = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def start_server(root: Path, port: int) -> subprocess.Popen:
    mlflow = str(Path(PYTHON).parent / "mlflow")
    return subprocess.Popen([mlflow, "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"], env=SERVER_ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def wait_ready(uri: str, server: subprocess.Popen, within: float = 60) -> float:
    started = time.monotonic()
    while True:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=1).read()
            return time.monotonic() - started
        except OSError:
            assert server.poll() is None and time.monotonic() - started < within, "mlflow server did not start"
            time.sleep(0.2)


def step_records(output_dir: Path) -> list[dict]:
    metrics = PretrainLayout(output_dir).metrics
    if not metrics.exists():
        return []
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if "train/loss" in r]


@pytest.mark.slow  # an mlflow server started twice and a pretraining run: about 60 s
def test_a_tracking_server_killed_during_pretraining_and_restarted(tmp_path, roberta_shards, bpe_tokenizer_dir):
    from mlflow.tracking import MlflowClient

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path, port)
    out = tmp_path / "run"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tiny_pretrain_config(
        roberta_shards, bpe_tokenizer_dir, out, train={"max_steps": STEPS, "export": False},
        checkpoint={"every": 100}, tracking={"enabled": True, "uri": uri, "experiment": "outage"})))
    restarted = None
    try:
        wait_ready(uri, server)
        run = subprocess.Popen([PYTHON, "launchers/pretrain.py", "--config", str(config)], cwd=ROOT,
                               env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while len(step_records(out)) < 40:
            assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()[-3000:]
            time.sleep(0.05)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        killed_at_step = len(step_records(out))
        restarted = start_server(tmp_path, port)
        wait_ready(uri, restarted)
        back_at_step = len(step_records(out))
        log, _ = run.communicate(timeout=400)
        assert run.returncode == 0, log[-3000:]
        steps = step_records(out)
        # metrics.jsonl: every step once
        assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
        # the step did not stall: no gap between logged steps during the outage beyond a bound
        gaps = [b["time"] - a["time"] for a, b in zip(steps, steps[1:], strict=False)]
        normal = statistics.median(gaps[:killed_at_step - 1])
        outage = gaps[killed_at_step - 1: back_at_step]
        assert back_at_step - killed_at_step >= 20, "the outage must span steps"
        assert max(outage) < max(1.0, 20 * normal), (max(outage), normal)
        # exactly one warning names the server, and the server's return is noticed
        naming = [line for line in log.splitlines() if "warning" in line.lower() and f"127.0.0.1:{port}" in line]
        assert len(naming) == 1 and "is unreachable" in naming[0], naming
        assert f"MLflow tracking server {uri} is reachable again" in log
        # MLflow caught up: every step's loss, and the run finished
        client = MlflowClient(uri)
        run_id = json.loads(PretrainLayout(out).tracking.read_text())["run_id"]
        history = client.get_metric_history(run_id, "train/loss")
        assert sorted({m.step for m in history}) == list(range(1, STEPS + 1))
        assert client.get_run(run_id).info.status == "FINISHED"
        print(f"\nserver killed after step {killed_at_step}, back at step {back_at_step}; median step gap "
              f"{normal * 1000:.0f} ms, longest during the outage {max(outage) * 1000:.0f} ms", file=sys.stderr)
    finally:
        for proc in (server, restarted):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
