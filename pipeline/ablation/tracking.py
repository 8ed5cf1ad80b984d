"""A study in MLflow: one parent run, a child run per arm, and the arm's own runs hung beneath it.

Everything of a study goes to one experiment, `ablation-<study>`, so MLflow's UI nests the runs:

    study run                              (results.md/.csv, loss_curves.png)
      └─ arm run                           (the arm's settings, val perplexity, task medians)
           ├─ the pretraining run          (launchers/pretrain.py)
           └─ fine-tuning summary per task (launchers/finetune.py) └─ one run per seed

The pretraining and fine-tuning runs are made by their own commands; they are linked afterwards
by tags: `mlflow.parentRunId` (MLflow's nesting), `ablation.study`, `ablation.arm`. A fine-tuning
run is found by the `pretrain_run_id` tag it carries. Linking is idempotent, so a rerun re-links.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.tracking.metrics import MetricsSink
from pipeline.tracking.settings import TrackingConfig
from pipeline.tracking.sinks import open_metrics


def experiment_name(study: str) -> str:
    return f"ablation-{study}"


def open_study_run(uri: str, study: str, state_file: Path, params: dict, enabled: bool = True) -> MetricsSink:
    """The study's parent run, reopened on a rerun (its id is kept in `state_file`)."""
    tracking = TrackingConfig(enabled=enabled, uri=uri, experiment=experiment_name(study))
    return open_metrics(True, tracking=tracking, run_name=study, state_file=state_file,
                        tags={"ablation.study": study, "ablation.role": "study"}, params=params)


def open_arm_run(uri: str, study: str, arm: str, parent: MetricsSink, state_file: Path, params: dict,
                 enabled: bool = True) -> MetricsSink:
    """The arm's child run of the study's run."""
    tags = {"ablation.study": study, "ablation.arm": arm, "ablation.role": "arm"}
    if getattr(parent, "run_id", None):
        tags["mlflow.parentRunId"] = parent.run_id
    tracking = TrackingConfig(enabled=enabled, uri=uri, experiment=experiment_name(study))
    return open_metrics(True, tracking=tracking, run_name=arm, state_file=state_file, tags=tags, params=params)


def link_arm_runs(uri: str, study: str, arm: str, arm_run_id: str | None, pretrain_tracking: Path) -> int:
    """Tag the arm's pretraining run and its fine-tuning runs as the arm's; the number of runs linked.

    Best-effort like all tracking here: a failure prints one warning and the study goes on.
    """
    if not arm_run_id or not pretrain_tracking.exists():
        return 0
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        pretrain_id = json.loads(pretrain_tracking.read_text())["run_id"]
        tags = {"ablation.study": study, "ablation.arm": arm}
        children = {pretrain_id: {**tags, "ablation.role": "pretrain", "mlflow.parentRunId": arm_run_id}}
        experiment = client.get_run(pretrain_id).info.experiment_id
        for run in client.search_runs([experiment], filter_string=f"tags.pretrain_run_id = '{pretrain_id}'"):
            role = run.data.tags.get("stage", "finetune")
            children[run.info.run_id] = {**tags, "ablation.role": role}
            if role == "finetune-summary":  # the seeds stay under their task's summary run
                children[run.info.run_id]["mlflow.parentRunId"] = arm_run_id
        for run_id, run_tags in children.items():
            for key, value in run_tags.items():
                client.set_tag(run_id, key, value)
        return len(children)
    except Exception as err:  # noqa: BLE001 - tracking never stops the study
        print(f"warning: could not link arm {arm}'s runs in MLflow ({uri}): {type(err).__name__}: {err}", flush=True)
        return 0
