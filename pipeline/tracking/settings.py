"""The tracking section of a config (pretraining's and fine-tuning's): MLflow on or off, where, under which
experiment and run name, how often to flush, and the registry name for the run's model."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.common.config.tree import refuse


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str | None = None
    """MLflow tracking URI; None: $MLFLOW_TRACKING_URI, else `sqlite:///mlflow.db` in the working directory."""
    experiment: str = "pretrain"
    run_name: str | None = None
    flush_seconds: float = 10.0
    """Seconds between waits for MLflow's background logging (also at evals, checkpoints, the end)."""
    registered_model: str | None = None
    """Also register the run's model (the export; each fine-tuning seed's saved model) under this registry name."""

    def __post_init__(self):
        if not self.experiment:
            refuse(self, ["tracking.experiment: must not be empty"])
