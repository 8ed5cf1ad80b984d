"""A training checkpoint → an HF model folder (safetensors, config, tokenizer), from any ZeRO stage.

The weights are consolidated to fp32 with DeepSpeed's own `zero_to_fp32` (a ZeRO-0 checkpoint holds
whole weights already) and loaded into transformers' plain class with strict key checking, so the
folder loads with `from_pretrained` and in `pipeline("fill-mask")`. It is written beside the target
and renamed into place.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from pipeline.common.atomic_files import staged_folder, write_json_atomic
from pipeline.common.errors import PipelineError
from pipeline.common.fingerprints import checkpoint_fingerprint
from pipeline.common.run_layout import PretrainLayout
from pipeline.pretrain.checkpoint_record import CheckpointRecord, read_record
from pipeline.pretrain.checkpoints import check_intact, resolve_checkpoint

PROVENANCE_FILE = "pipeline_export.json"
"""Where an export records its checkpoint and pretraining MLflow run, for fine-tuning runs to link to."""


def provenance(checkpoint: Path, record: CheckpointRecord) -> dict:
    run_folder = PretrainLayout.of_checkpoint(checkpoint)
    tracking = run_folder.tracking if run_folder else None
    run = json.loads(tracking.read_text()) if tracking and tracking.exists() else {}
    return {"checkpoint": str(checkpoint.resolve()), "step": record.step,
            "checkpoint_fingerprint": checkpoint_fingerprint(record),
            "pretrain_run_id": run.get("run_id"), "tracking_uri": run.get("uri")}


def _deepspeed_safe_globals() -> list:
    """The few DeepSpeed types its checkpoints pickle besides tensors and plain containers."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


def load_checkpoint_file(path: Path) -> Any:
    """`torch.load` with `weights_only=True`: tensors, containers and the allow-listed DeepSpeed types only.

    A checkpoint is a pickle, and a pickle from elsewhere can run code when loaded the default way.
    """
    with torch.serialization.safe_globals(_deepspeed_safe_globals()):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            found = re.search(r"Unsupported global: GLOBAL (\S+)|Unsupported operand \S+", str(err))
            what = found.group(1) or found.group(0) if found else "an object the safe loader refuses"
            raise PipelineError(f"{path}: refused to load: it holds {what}, not only tensors and DeepSpeed's "
                                "checkpoint types, and could run code when unpickled. Only load checkpoints "
                                "you trust") from None


def consolidated_state_dict(checkpoint: Path, zero_stage: int) -> dict[str, torch.Tensor]:
    """fp32 weights of the whole model, whatever the ZeRO stage and world size it was saved with."""
    if zero_stage > 0 or any(checkpoint.glob("*optim_states.pt")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        # DeepSpeed's consolidation unpickles with weights_only=False. Every file it will read is
        # first loaded here the safe way, so it only ever unpickles what passed the allow-list. This
        # reads the checkpoint twice; an export is a one-off, and safety is worth the extra read.
        for path in sorted(checkpoint.glob("*.pt")):
            load_checkpoint_file(path)
        try:
            return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint.parent), tag=checkpoint.name)
        except ValueError:
            if zero_stage > 0:
                raise
    states = load_checkpoint_file(checkpoint / "mp_rank_00_model_states.pt")
    return {k: v.float() for k, v in states["module"].items()}


def export_checkpoint(path: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """Write the HF model folder for checkpoint (or output folder) `path` to `out`; return `out`."""
    from transformers import AutoTokenizer

    from pipeline.common.config_tree import build_config
    from pipeline.data.tokenizer import describe_tokenizer
    from pipeline.pretrain.config import ModelConfig
    from pipeline.pretrain.model import EXPORT_CLASSES, hf_config

    checkpoint = resolve_checkpoint(path).resolve()  # absolute: its name is the tag DeepSpeed loads by
    check_intact(checkpoint)  # a damaged file is refused with the message resume warns with
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise PipelineError(f"{out} exists and is not empty; choose another --out or pass --overwrite")
    record = read_record(checkpoint)
    config = record.config
    # The run's own copy of the tokenizer; a loose checkpoint falls back to the one its config names.
    run_folder = PretrainLayout.of_checkpoint(checkpoint)
    own_copy = run_folder.tokenizer if run_folder and run_folder.tokenizer.is_dir() else None
    tokenizer = AutoTokenizer.from_pretrained(own_copy or config["data"]["tokenizer"])
    cls = EXPORT_CLASSES[record.architecture]
    if record.hf_config:  # the trained model's config as built (an init_from folder's own shape)
        hf = cls.config_class.from_dict(record.hf_config)
    else:  # checkpoints written before the record held it
        model_config, _ = build_config(ModelConfig, config["model"])
        hf = hf_config(model_config, describe_tokenizer(tokenizer), record.seq_len)
    model = cls(hf)
    state = consolidated_state_dict(checkpoint, record.zero_stage)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise PipelineError(f"checkpoint {checkpoint} does not match {type(model).__name__}: "
                            f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    with staged_folder(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_json_atomic(tmp / PROVENANCE_FILE, provenance(checkpoint, record))
    return out
