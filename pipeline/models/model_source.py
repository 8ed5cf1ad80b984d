"""Where a model comes from: an HF folder, a hub name, a pretraining run or checkpoint, a fine-tuning output.

The one resolver behind fine-tuning's `--model`, the hub's `Encoder.from_pretrained` and the embedding
encoder. Every source ends as one HF folder (or hub name) plus what the pipeline knows of it: a
fine-tuning output brings its task name and `pipeline_finetune.json`; an export brings the pretraining
run and checkpoint it came from. A pretraining run or checkpoint is turned into an HF folder by the
`exporter` the caller hands in (pretraining's `export_for_loading`, which exports it once): this floor
sits below pretraining, whose export proves the folder on the training path, so the commands bring the
exporter and a library caller without one is told to export first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.common.errors import PipelineError
from pipeline.common.hub_names import local_or_hub
from pipeline.common.run_layout import (
    CHECKPOINT_RECORD_FILE,
    EXPORT_PROVENANCE_FILE,
    FINETUNE_PROVENANCE_FILE,
    FinetuneLayout,
    PretrainLayout,
)

Exporter = Callable[..., Path]
"""A pretraining run or checkpoint → its HF folder: `exporter(path, export_to=, cache_dir=, is_main=, barrier=,
keep_export=, model=)` (pretraining's `export_for_loading`, in its export folder module)."""

OFFSET_POSITION_MODELS = {"roberta", "xlm-roberta", "camembert", "roberta-prelayernorm"}
"""Model types that number positions from pad_token_id + 1 (fairseq's convention), not from 0."""


@dataclass(frozen=True)
class ModelSource:
    """An HF folder (or hub name) and where it came from."""

    path: str
    """An HF model folder, or a hub name such as `roberta-base`."""
    task: str | None = None
    """The fine-tuning task whose head the folder holds (None for an MLM model)."""
    finetune_info: dict = field(default_factory=dict)
    """`pipeline_finetune.json` of a fine-tuned model (empty otherwise)."""
    pretrain_run_id: str | None = None
    """The MLflow run that pretrained an export (for the link from fine-tuning runs)."""
    pretrain_checkpoint: str | None = None
    """The checkpoint an export was made from."""


def position_limit(config) -> int:
    """The longest token sequence a transformers model config's position embeddings cover.

    RoBERTa's family spends pad_token_id + 1 slots of its table before the first position; BERT's table and
    ModernBERT's `max_position_embeddings` (rotary: the length it was trained for) are the length itself.
    """
    offset = config.pad_token_id + 1 if config.model_type in OFFSET_POSITION_MODELS else 0
    return config.max_position_embeddings - offset


def is_pretraining_output(path: Path) -> bool:
    """A checkpoint folder, or a pretraining output folder holding checkpoints."""
    return path.is_dir() and ((path / CHECKPOINT_RECORD_FILE).exists() or PretrainLayout(path).checkpoints.is_dir())


def resolve_model_source(model: str | os.PathLike, *, exporter: Exporter | None = None,
                         export_to: Path | None = None, cache_dir: str | os.PathLike | None = None,
                         is_main: bool = True, barrier: Callable[[], None] = lambda: None,
                         keep_export: bool = False, what: str = "model") -> ModelSource:
    """`model` as an HF folder or hub name, a pretraining run or checkpoint exported first by `exporter`.

    With several processes every one must call this (the exporter holds a barrier). `export_to`,
    `cache_dir`, `is_main`, `barrier` and `keep_export` go to the exporter. `what` names the argument
    in errors.
    """
    text = local_or_hub(model, what)
    path = Path(text)
    if not path.is_dir():
        return ModelSource(text)  # a hub name
    if FinetuneLayout(path).best_model.is_file():
        return _finetune_output(path)
    if (path / FINETUNE_PROVENANCE_FILE).is_file():
        return _finetuned_folder(path)
    if is_pretraining_output(path):
        if exporter is None:
            raise PipelineError(f"{what} {model}: a pretraining run or checkpoint, which this call cannot export; "
                                f"export it first (roberta-export {model} OUT) and load OUT, or give it to a "
                                "command, which exports it (roberta-finetune, roberta-predict, roberta-cloze, "
                                "roberta-embed-eval)")
        return _export_source(exporter(path, export_to=export_to, cache_dir=cache_dir, is_main=is_main,
                                       barrier=barrier, keep_export=keep_export, model=str(model)))
    if (path / "config.json").is_file():
        return _export_source(path)
    if (path / "export" / "config.json").is_file():
        return _export_source(path / "export")  # a pretraining output whose checkpoints were removed
    raise PipelineError(f"{what} {model}: not an HF model folder (no config.json), a fine-tuning output (no "
                        "best_model.json), nor a pretraining checkpoint or output folder (no complete.json, "
                        "no checkpoints/)")


def _export_source(folder: Path) -> ModelSource:
    provenance = folder / EXPORT_PROVENANCE_FILE
    if not provenance.is_file():
        return ModelSource(str(folder))
    info = _read_json(provenance)
    return ModelSource(str(folder), pretrain_run_id=info.get("pretrain_run_id"),
                       pretrain_checkpoint=info.get("checkpoint"))


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
    source = _finetuned_folder(model) if (model / FINETUNE_PROVENANCE_FILE).is_file() else ModelSource(str(model))
    return ModelSource(source.path, best.get("task") or source.task, source.finetune_info)


def _finetuned_folder(folder: Path) -> ModelSource:
    info = _read_json(folder / FINETUNE_PROVENANCE_FILE)
    if not isinstance(info.get("task"), str):
        raise PipelineError(f"{folder / FINETUNE_PROVENANCE_FILE}: expected a \"task\" key with the task's name")
    return ModelSource(str(folder), info["task"], info)
