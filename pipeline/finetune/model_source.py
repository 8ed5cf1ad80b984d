"""Where a model comes from: an HF folder, a hub name, a pretraining run or checkpoint, a fine-tuning output.

The one resolver behind fine-tuning's `--model` and the hub's `Encoder.from_pretrained`. Every
source ends as one HF folder (or hub name) plus what the pipeline knows of it: a fine-tuning output
brings its task name and `pipeline_finetune.json`; an export brings the pretraining run and
checkpoint it came from. A pretraining checkpoint (or output folder) is exported once: into
`export_to` when the caller names the folder (fine-tuning's `source_model/`), else into a cache keyed
by the checkpoint's path and fingerprint, so a second load is instant and never rewrites an earlier
export. Only the main process exports; the others wait at `barrier` and then read the finished
folder, since several processes exporting into one folder would race on its temporary and final names.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.common.errors import PipelineError
from pipeline.common.hub_names import local_or_hub
from pipeline.common.run_layout import FINETUNE_PROVENANCE_FILE, FinetuneLayout, PretrainLayout
from pipeline.pretrain.checkpoints.storage import resolve_checkpoint
from pipeline.pretrain.export.folder import PROVENANCE_FILE, exported_from, exported_identity
from pipeline.pretrain.plan.record import RECORD_FILE

if TYPE_CHECKING:
    from pipeline.finetune.config import FinetuneConfig

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


def cap_seq_len(config: FinetuneConfig, model: str, *, say: bool = True) -> FinetuneConfig:
    """`config` with `data.max_seq_len` at most what `model` can take, saying so (with `say`) when it cuts.

    A longer input would index past the position table and crash inside the embeddings; HF's run_glue caps
    the length the same way. A QA stride that no longer fits the capped windows is an error.
    """
    import dataclasses

    from transformers import AutoConfig

    from pipeline.finetune.config import doc_stride_problem
    from pipeline.finetune.tasks import QA_TASKS

    limit = position_limit(AutoConfig.from_pretrained(model))
    asked = config.data.max_seq_len
    if asked <= limit:
        return config
    if config.task in QA_TASKS and (problem := doc_stride_problem(config.data.doc_stride, limit)):
        raise PipelineError(f"{problem}: data.max_seq_len {asked} is capped to {limit}, the most tokens {model} "
                            f"takes (its position embeddings); lower data.doc_stride")
    if say:
        print(f"data.max_seq_len {asked}: {model} takes at most {limit} tokens (its position embeddings); "
              f"fine-tuning uses {limit}", flush=True)
    return dataclasses.replace(config, data=dataclasses.replace(config.data, max_seq_len=limit))


def default_cache_dir() -> Path:
    """`$ROBERTA_PIPELINE_CACHE`, else `~/.cache/roberta-pipeline`: where on-the-fly exports are kept."""
    return Path(os.environ.get("ROBERTA_PIPELINE_CACHE") or Path.home() / ".cache" / "roberta-pipeline")


def is_pretraining_output(path: Path) -> bool:
    """A checkpoint folder, or a pretraining output folder holding checkpoints."""
    return path.is_dir() and ((path / RECORD_FILE).exists() or PretrainLayout(path).checkpoints.is_dir())


def resolve_model_source(model: str | os.PathLike, *, export_to: Path | None = None,
                         cache_dir: str | os.PathLike | None = None, is_main: bool = True,
                         barrier: Callable[[], None] = lambda: None, keep_export: bool = False,
                         what: str = "model") -> ModelSource:
    """`model` as an HF folder or hub name, exporting a pretraining checkpoint first if needed.

    With several processes every one must call this (it holds a barrier). `keep_export` (finished
    seeds were fine-tuned from the weights in `export_to`): an export of another checkpoint there is
    refused, on every process, rather than replaced. `what` names the argument in errors.
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
        checkpoint = resolve_checkpoint(path).resolve()
        if export_to is None:
            folder = _export_cached(checkpoint, Path(cache_dir) if cache_dir else default_cache_dir())
        else:
            folder = _export_into(checkpoint, export_to, str(model), is_main, barrier, keep_export)
        return _export_source(folder)
    if (path / "config.json").is_file():
        return _export_source(path)
    if (path / "export" / "config.json").is_file():
        return _export_source(path / "export")  # a pretraining output whose checkpoints were removed
    raise PipelineError(f"{what} {model}: not an HF model folder (no config.json), a fine-tuning output (no "
                        "best_model.json), nor a pretraining checkpoint or output folder (no complete.json, "
                        "no checkpoints/)")


def _export_source(folder: Path) -> ModelSource:
    provenance = folder / PROVENANCE_FILE
    if not provenance.is_file():
        return ModelSource(str(folder))
    info = _read_json(provenance)
    return ModelSource(str(folder), pretrain_run_id=info.get("pretrain_run_id"),
                       pretrain_checkpoint=info.get("checkpoint"))


def _export_into(checkpoint: Path, export_to: Path, model: str, is_main: bool, barrier: Callable[[], None],
                 keep_export: bool) -> Path:
    """Export `checkpoint` into the caller's folder unless it already holds this very checkpoint."""
    made_from, identity = exported_from(export_to), exported_identity(checkpoint)
    if keep_export and made_from is not None and made_from != identity:
        raise PipelineError(f"{export_to} is the export of {made_from[0]} (fingerprint {made_from[1]}) that "
                            f"the finished seeds beside it were fine-tuned from; --model {model} now holds "
                            f"another checkpoint (fingerprint {identity[1]}). Choose another "
                            "train.output_dir, or delete the folder to redo it")
    if is_main and made_from != identity:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # consolidating weights needs no GPU
        from pipeline.pretrain.export.folder import export_checkpoint

        export_checkpoint(checkpoint, export_to, overwrite=True)
        print(f"exported {checkpoint} to {export_to} (rank {os.environ.get('RANK', '0')})", flush=True)
    barrier()
    return export_to


def _export_cached(checkpoint: Path, cache_dir: Path) -> Path:
    """Export `checkpoint` once into the cache; later loads reuse the folder."""
    from pipeline.pretrain.export.folder import export_checkpoint

    identity = exported_identity(checkpoint)  # path and fingerprint: a retrained run's same-named step is another
    run = PretrainLayout.of_checkpoint(checkpoint)
    if run and exported_from(run.export) == identity:
        return run.export  # the run's own export is of this very checkpoint
    key = hashlib.sha256(":".join(identity).encode()).hexdigest()[:16]
    out = cache_dir / "exports" / f"{checkpoint.name}-{key}"
    if not (out / "config.json").is_file():
        export_checkpoint(checkpoint, out, overwrite=True)
    return out


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
