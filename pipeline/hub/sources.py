"""Where `Encoder.from_pretrained` finds a model folder: an export, a pretraining run, a fine-tuning run, a hub name.

Every source ends as one HF folder (or hub name) plus what the pipeline knows about it: a
fine-tuning output brings its task name and `pipeline_finetune.json`; a pretraining output folder
or checkpoint is exported once with `export_checkpoint` into a cache keyed by the checkpoint's
path and step, so a second load is instant and never rewrites an earlier export.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.common.errors import PipelineError
from pipeline.common.hub_names import local_or_hub
from pipeline.common.run_layout import FinetuneLayout, PretrainLayout
from pipeline.finetune.outputs import PROVENANCE_FILE as FINETUNE_INFO_FILE


@dataclass(frozen=True)
class ModelSource:
    path: str
    """An HF model folder, or a hub name such as `roberta-base`."""
    task: str | None = None
    """The fine-tuning task whose head the folder holds (None for an MLM model)."""
    finetune_info: dict = field(default_factory=dict)
    """`pipeline_finetune.json` of a fine-tuned model (empty otherwise)."""


def default_cache_dir() -> Path:
    """`$ROBERTA_PIPELINE_CACHE`, else `~/.cache/roberta-pipeline`: where on-the-fly exports are kept."""
    return Path(os.environ.get("ROBERTA_PIPELINE_CACHE") or Path.home() / ".cache" / "roberta-pipeline")


def resolve_source(path_or_name: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> ModelSource:
    """Turn what the user passed into an HF folder or hub name, exporting a pretraining checkpoint if needed."""
    from pipeline.finetune.model_source import is_pretraining_output

    text = local_or_hub(path_or_name, "model")
    path = Path(text)
    if not path.is_dir():
        return ModelSource(text)  # a hub name
    if FinetuneLayout(path).best_model.is_file():
        return _finetune_output(path)
    if (path / FINETUNE_INFO_FILE).is_file():
        return _finetuned_folder(path)
    if is_pretraining_output(path):
        return ModelSource(str(_export_cached(path, Path(cache_dir) if cache_dir else default_cache_dir())))
    if (path / "config.json").is_file():
        return ModelSource(str(path))
    if (path / "export" / "config.json").is_file():
        return ModelSource(str(path / "export"))  # a pretraining output whose checkpoints were removed
    raise PipelineError(f"model {path}: not an HF model folder (no config.json), a fine-tuning output (no "
                        "best_model.json), nor a pretraining checkpoint or output folder (no "
                        "complete.json, no checkpoints/)")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise PipelineError(f"{path}: cannot read it as JSON: {err}") from None


def _finetune_output(folder: Path) -> ModelSource:
    pointer = FinetuneLayout(folder).best_model
    best = _read_json(pointer)
    if not isinstance(best.get("path"), str):
        raise PipelineError(f"{pointer}: expected a \"path\" key naming the best seed's model "
                            "folder (e.g. \"seed_1/model\")")
    model = folder / best["path"]
    if not (model / "config.json").is_file():
        raise PipelineError(f"{pointer} points to {model}, which holds no saved model "
                            "(no config.json): was the run interrupted?")
    source = _finetuned_folder(model) if (model / FINETUNE_INFO_FILE).is_file() else ModelSource(str(model))
    return ModelSource(source.path, best.get("task") or source.task, source.finetune_info)


def _finetuned_folder(folder: Path) -> ModelSource:
    info = _read_json(folder / FINETUNE_INFO_FILE)
    if not isinstance(info.get("task"), str):
        raise PipelineError(f"{folder / FINETUNE_INFO_FILE}: expected a \"task\" key with the task's name")
    return ModelSource(str(folder), info["task"], info)


def _export_cached(path: Path, cache_dir: Path) -> Path:
    """Export the newest complete checkpoint under `path` once; later loads reuse the folder."""
    from pipeline.finetune.model_source import exported_from, exported_identity
    from pipeline.pretrain.checkpoints import resolve_checkpoint
    from pipeline.pretrain.export import export_checkpoint

    checkpoint = resolve_checkpoint(path).resolve()
    identity = exported_identity(checkpoint)  # path and fingerprint: a retrained run's same-named step is another
    run = PretrainLayout.of_checkpoint(checkpoint)
    if run and exported_from(run.export) == identity:
        return run.export  # the run's own export is of this very checkpoint
    key = hashlib.sha256(":".join(identity).encode()).hexdigest()[:16]
    out = cache_dir / "exports" / f"{checkpoint.name}-{key}"
    if not (out / "config.json").is_file():
        export_checkpoint(checkpoint, out, overwrite=True)
    return out
