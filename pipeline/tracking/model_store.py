"""MLflow as a model store: trained encoders logged as models to load, register and serve; their data as inputs.

`log_encoder_model` logs a saved fine-tuned model or a pretraining export as an MLflow `pyfunc`
model wrapping the hub interface (`pipeline.hub.Encoder`), so

    mlflow.pyfunc.load_model(f"runs:/{run_id}/model").predict(["a sentence", ...])

returns label names for a fine-tuned model (rows of one text, or `text` and `text_b` columns for
pairs), and the best filling of each text's `<mask>` for an export. A pyfunc around the Encoder
rather than the `transformers` flavour: it loads offline from the logged folder, keeps the task's
label names and truncation, and serves with `mlflow models serve -m runs:/<id>/model`.

The model is logged from code, not pickled: MLflow stores `pipeline/hub/encoder_pyfunc.py` (the
wrapper belongs to the interface it wraps) and the `pipeline` package, and rebuilds the model on
load by running that file. This module finds the file by its module name (through the import
system, so it is the installed copy wherever the package lives) and imports nothing from hub/.

`log_dataset_inputs` records shard folders and task files as MLflow dataset inputs (name, digest
of `index.json` or of the file, source path), which the UI shows in the Dataset column.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.atomic_files import sha256_file
from pipeline.common.errors import PipelineError
from pipeline.common.run_layout import FINETUNE_PROVENANCE_FILE

ENCODER_PYFUNC_MODULE = "pipeline.hub.encoder_pyfunc"
"""The models-from-code module MLflow runs to rebuild a logged model (it calls `mlflow.models.set_model`)."""


def module_file(name: str) -> Path:
    """The source file of module `name`, found by the import system without running it or its package."""
    parent, _, leaf = name.rpartition(".")
    package = importlib.util.find_spec(parent)
    spec = importlib.machinery.PathFinder.find_spec(leaf, package.submodule_search_locations) if package else None
    if spec is None or spec.origin is None:
        raise PipelineError(f"module {name} not found: is the pipeline package installed completely?")
    return Path(spec.origin)


def package_dir() -> Path:
    """The `pipeline` package's folder, logged with every model so that `mlflow models serve` can import it."""
    return Path(importlib.util.find_spec("pipeline").origin).parent


def _requirements() -> list[str]:
    """Pinned to this environment: `mlflow models serve` rebuilds it from these lines."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in ("torch", "transformers", "tokenizers", "mlflow", "numpy")]


def log_encoder_model(model_dir: str | Path, run_id: str, *, tracking_uri: str | None = None, name: str = "model",
                      registered_model_name: str | None = None, model_code: str | Path | None = None) -> str:
    """Log the HF folder `model_dir` (fine-tuned or export) to run `run_id` as pyfunc model `name`; the model URI.

    `registered_model_name` also registers it in the model registry (a new version each call).
    `model_code`: the models-from-code file that rebuilds the model on load (default: the hub's wrapper).
    """
    import mlflow

    from pipeline.tracking.mlflow_run import default_tracking_uri

    model_dir = Path(model_dir)
    model_code = model_code or module_file(ENCODER_PYFUNC_MODULE)
    if not (model_dir / "config.json").is_file():
        raise PipelineError(f"{model_dir}: not a saved model folder (no config.json); log a fine-tuned seed's "
                            "model/ folder or a pretraining export")
    config = json.loads((model_dir / "config.json").read_text())
    classifier = any(a.endswith("ForSequenceClassification") for a in config.get("architectures") or [])
    info_file = model_dir / FINETUNE_PROVENANCE_FILE
    metadata = {"kind": "classifier" if classifier else "masked-lm",
                **({"task": json.loads(info_file.read_text()).get("task")} if info_file.is_file() else {})}
    # set_tracking_uri also writes $MLFLOW_TRACKING_URI, which every process started later would inherit
    # (a launch after this call tracked into the wrong store): both are put back as they were.
    previous, previous_env = mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(tracking_uri or default_tracking_uri())
    try:
        with mlflow.start_run(run_id=run_id):
            info = mlflow.pyfunc.log_model(
                name=name, python_model=str(model_code), artifacts={"model": str(model_dir)},
                code_paths=[str(package_dir())],  # the `pipeline` package, for serving
                pip_requirements=_requirements(), metadata=metadata,
                # No signature: a schema would turn a plain list of texts into a one-column frame named 0;
                # `EncoderModel` reads lists of texts or pairs and `text`/`text_b` frames itself.
                registered_model_name=registered_model_name)
    finally:
        mlflow.set_tracking_uri(previous)
        if previous_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env
    return info.model_uri


@dataclass(frozen=True)
class DatasetRecord:
    """One MLflow dataset input: what the UI's Dataset column shows."""

    name: str
    path: str
    digest: str
    """At most 36 characters (MLflow's limit): the first 32 hex digits of a sha256."""
    sha256: str
    context: str


def shard_dataset(folder: str | Path, context: str = "training") -> DatasetRecord:
    """A shard folder, fingerprinted by its `index.json` (which lists every shard's checksum)."""
    from pipeline.data.shards.index import INDEX_NAME, load_index

    folder = Path(folder).resolve()
    load_index(folder)  # a folder without a committed index is not a dataset yet
    digest = sha256_file(folder / INDEX_NAME)
    return DatasetRecord(folder.name, str(folder), digest[:32], digest, context)


def file_dataset(path: str | Path, context: str) -> DatasetRecord:
    """A task file (train, dev or test), fingerprinted by its bytes."""
    path = Path(path).resolve()
    if not path.is_file():
        raise PipelineError(f"dataset file {path} does not exist")
    digest = sha256_file(path)
    return DatasetRecord(f"{path.parent.name}/{path.name}", str(path), digest[:32], digest, context)


def log_dataset_inputs(run_id: str, records: list[DatasetRecord], tracking_uri: str | None = None) -> None:
    """Attach `records` to run `run_id` as dataset inputs (name, digest, source path, context tag)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    from pipeline.tracking.mlflow_run import default_tracking_uri

    inputs = []
    for record in records:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MLflow warns that a local path matches two equivalent source types
            source = resolve_dataset_source(record.path)
        dataset = MetaDataset(source, name=record.name, digest=record.digest)
        inputs.append(DatasetInput(dataset._to_mlflow_entity(), tags=[
            InputTag(MLFLOW_DATASET_CONTEXT, record.context), InputTag("sha256", record.sha256)]))
    MlflowClient(tracking_uri or default_tracking_uri()).log_inputs(run_id, datasets=inputs)


def record_in_model_store(sink, model_dir: str | Path | None = None, datasets: list[DatasetRecord] = (),
                          registered_model_name: str | None = None) -> None:
    """The trainers' one call at the end of a run or seed: datasets as inputs, the model as an MLflow model.

    `sink` is the trainer's metrics sink; without a working MLflow run in it there is nothing to
    do. Best-effort, like all tracking: a failure prints one warning and the run's own outputs stay.
    """
    import sys

    from pipeline.tracking.mlflow_run import MlflowSink

    run = next((s for s in (sink, *getattr(sink, "sinks", ())) if isinstance(s, MlflowSink)), None)
    if run is None or not run.enabled or not run.run_id:
        return
    try:
        run.flush()
        if datasets:
            log_dataset_inputs(run.run_id, list(datasets), run.uri)
        if model_dir is not None:
            log_encoder_model(model_dir, run.run_id, tracking_uri=run.uri, registered_model_name=registered_model_name)
    except Exception as err:  # noqa: BLE001 - the model store must never fail a finished training run
        warnings.warn(f"MLflow model store ({run.uri}): {type(err).__name__}: {str(err)[:300]}", stacklevel=2)
        print(f"warning: could not log the model/datasets to MLflow at {run.uri} ({type(err).__name__})",
              file=sys.stderr)


def task_datasets(data) -> list[DatasetRecord]:
    """The task files of a fine-tuning `TaskData` that are local files (train, dev splits, test splits)."""
    splits = [("training", data.train), *(("evaluation", s) for s in data.dev.values()),
              *(("test", s) for s in data.test.values())]
    return [file_dataset(split.source, context) for context, split in splits if Path(split.source).is_file()]
