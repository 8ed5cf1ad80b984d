"""The metrics interface: a null sink off rank 0, the JSONL file, MLflow (asynchronous, best-effort, same run)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from pipeline.tracking.metrics import FanOut, JsonlSink, MetricsSink
from pipeline.tracking.sinks import open_metrics


def tracking(uri: str) -> SimpleNamespace:
    return SimpleNamespace(enabled=True, uri=uri, experiment="tests", flush_seconds=0.0)


def records(path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in path.read_text().splitlines()]


def test_ranks_other_than_0_get_a_sink_that_writes_nothing(tmp_path):
    sink = open_metrics(False, jsonl=tmp_path / "metrics.jsonl", tracking=tracking("http://127.0.0.1:9"))
    assert type(sink) is MetricsSink and sink.run_id is None
    sink.log({"train/loss": 1.0}, 1)
    sink.close()
    assert not (tmp_path / "metrics.jsonl").exists()


def test_jsonl_keeps_metrics_and_events_and_drops_redone_steps_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    for step in (1, 2, 3):
        sink.log({"train/loss": 4.0 - step, "train/grad_norm": None}, step)
    sink.event({"checkpoint": "step_00000002"}, 2)
    sink.close()
    resumed = JsonlSink(path, resume_step=2)  # the run resumes from the checkpoint at step 2
    resumed.log({"train/loss": 0.5}, 3)
    resumed.close()
    assert records(path) == [{"step": 1, "train/loss": 3.0}, {"step": 2, "train/loss": 2.0},
                             {"step": 2, "checkpoint": "step_00000002"}, {"step": 3, "train/loss": 0.5}]


def test_an_unreachable_mlflow_warns_once_and_the_jsonl_keeps_everything(tmp_path, capsys):
    sink = open_metrics(True, jsonl=tmp_path / "metrics.jsonl", tracking=tracking("http://127.0.0.1:9"),
                        run_name="r", state_file=tmp_path / "tracking.json", params={"a": 1})
    assert isinstance(sink, FanOut)
    for step in (1, 2):
        sink.log({"train/loss": 1.0 / step}, step)
    sink.log_artifact(tmp_path / "metrics.jsonl")
    sink.close()
    assert capsys.readouterr().err.count("MLflow tracking at http://127.0.0.1:9 is off for this run") == 1
    assert [r["step"] for r in records(tmp_path / "metrics.jsonl")] == [1, 2]
    assert not (tmp_path / "tracking.json").exists()


def test_mlflow_gets_every_step_and_a_resume_reopens_the_same_run(tmp_path):
    from mlflow.tracking import MlflowClient

    from pipeline.tracking.mlflow_run import MlflowSink

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    state = tmp_path / "tracking.json"
    first = MlflowSink(uri, "tests", "run", state, flush_seconds=60.0, tags={"stage": "pretrain"},
                       params={"train.max_steps": 4})
    for step in range(1, 4):
        first.log({"train/loss": 1.0 / step}, step)  # sent in the background
    first.close("KILLED")
    # The resumed run changes a param (MLflow would refuse to overwrite it) and the world size tag.
    second = MlflowSink(uri, "tests", "run", state, flush_seconds=60.0, tags={"world_size": "2"},
                        params={"train.max_steps": 8})
    second.log({"train/loss": 0.2}, 4)
    second.close()
    assert second.reopened and second.run_id == first.run_id
    client = MlflowClient(uri)
    run = client.get_run(first.run_id)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == [1, 2, 3, 4]
    assert run.data.params == {"train.max_steps": "4"} and run.data.tags["world_size"] == "2"
    assert run.info.status == "FINISHED"
    # Artifacts beside the sqlite store, not in the working directory's mlruns/.
    assert run.info.artifact_uri.startswith((tmp_path / "mlruns").as_uri())
