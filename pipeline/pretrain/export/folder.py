"""A training checkpoint → an HF model folder (safetensors, config, tokenizer, model card), from any ZeRO stage,
proven to compute what the training-time model computed; a run's checkpoints → revisions under one root.

The weights are consolidated to fp32 with DeepSpeed's own `zero_to_fp32` (a ZeRO-0 checkpoint holds
whole weights already) and loaded into transformers' plain class with strict key checking, so the
folder loads with `from_pretrained` and in `pipeline("fill-mask")`. It is written beside the target,
checked (`export_check.py`; the figures go to `pipeline_export.json` and the card, `export_card.py`), and
only then renamed into place: a folder that does not compute what the training model did is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pipeline.common.atomic_files import staged_folder, write_json_atomic
from pipeline.common.errors import PipelineError
from pipeline.common.run_layout import EXPORT_PROVENANCE_FILE, PretrainLayout
from pipeline.models.fingerprints import checkpoint_fingerprint
from pipeline.pretrain.checkpoints.record import RECORD_FILE, read_record
from pipeline.pretrain.checkpoints.storage import complete_checkpoints, resolve_checkpoint, tag_for
from pipeline.pretrain.export.facts import checkpoint_facts

PROVENANCE_FILE = EXPORT_PROVENANCE_FILE
"""An export's record: the checkpoint and pretraining MLflow run it came from (fine-tuning runs link to them),
what trained it, and its equivalence check."""


def exported_identity(checkpoint: Path) -> tuple[str, str]:
    """What an export of `checkpoint` records of it: its path and its fingerprint."""
    return str(checkpoint), checkpoint_fingerprint(read_record(checkpoint))


def exported_from(folder: Path) -> tuple[str, str] | None:
    """The checkpoint (path, fingerprint) an existing export was made from, or None."""
    try:
        info = json.loads((folder / PROVENANCE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return info.get("checkpoint"), info.get("checkpoint_fingerprint")


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
    """Write the HF model folder for checkpoint (or output folder) `path` to `out`, proven; return `out`.

    The folder is written beside `out`, checked (check.py: the run's tokenizer first, then one validation batch
    through the training-time model, rebuilt from the run's config, in fp32, and through the folder loaded by
    `AutoModelForMaskedLM`: their logits and MLM losses, and the folder's tokenizer against the shards'), and only
    then renamed into place with the figures in `pipeline_export.json` and a model card; beyond the tolerance it
    is refused.
    """
    from transformers import AutoTokenizer

    from pipeline.models.architectures.hf_model import exported_model
    from pipeline.pretrain.export.card import write_record_and_card
    from pipeline.pretrain.export.check import ExportProof

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise PipelineError(f"{out} exists and is not empty; choose another --out or pass --overwrite")
    facts = checkpoint_facts(path)  # a damaged file is refused with the message resume warns with
    proof = ExportProof(facts, AutoTokenizer.from_pretrained(facts.tokenizer))  # the tokenizer: before any weight
    state = consolidated_state_dict(facts.folder, facts.zero_stage)
    model, hf = exported_model(facts.architecture, facts.hf_config, facts.config.model, proof.info, facts.seq_len,
                               state, facts.folder)
    with staged_folder(out) as tmp:
        write_hf_folder(model, proof.tokenizer, tmp)
        check = proof.check(tmp, state, hf)
        write_record_and_card(tmp, facts, check.record(), proof.tokenizer, sum(p.numel() for p in model.parameters()),
                              shown_as=out.resolve())
    return out


def write_hf_folder(model, tokenizer, folder: Path) -> None:
    """The model's weights and config and the tokenizer, as `from_pretrained` reads them."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


REVISIONS_INDEX = "revisions.json"
"""Under a revisions root: each exported checkpoint's step, data seen, validation loss and equivalence figures."""


def export_revisions(path: str | Path, out: str | Path, *, steps: list[int] | None = None,
                     overwrite: bool = False) -> list[dict]:
    """A run's kept checkpoints (or those at `steps`) as HF folders `out/step_NNNNNNNN`, each proven as
    `export_checkpoint` proves one, and `out/revisions.json` indexing them; return the index.

    `path`: a run folder, its checkpoints folder or one of its checkpoints. A folder already holding the export
    of the very same checkpoint is kept (a rerun after more training exports only the new ones).
    """
    root = checkpoints_root(path)
    kept = {int(folder.name.removeprefix("step_")): folder for folder in complete_checkpoints(root)}
    if not kept:
        raise PipelineError(f"{path}: no complete checkpoint under {root}")
    if steps is not None and (absent := sorted(set(steps) - kept.keys())):
        raise PipelineError(f"--steps {','.join(map(str, absent))}: no complete checkpoint at "
                            f"{'that step' if len(absent) == 1 else 'those steps'} under {root}; kept: "
                            f"{', '.join(map(str, sorted(kept)))}")
    out = Path(out)
    index_path = out / REVISIONS_INDEX
    index = {entry["step"]: entry for entry in _read_index(index_path)}
    for step in sorted(kept if steps is None else set(steps)):
        checkpoint, folder = kept[step].resolve(), out / tag_for(step)
        if exported_from(folder) != exported_identity(checkpoint):
            export_checkpoint(checkpoint, folder, overwrite=overwrite)
        index[step] = revision_entry(folder, out)
        write_json_atomic(index_path, [index[s] for s in sorted(index)])  # after each one: a stop keeps the rest
    return [index[s] for s in sorted(index)]


def checkpoints_root(path: str | Path) -> Path:
    """The folder holding a run's `step_NNNNNNNN` checkpoints, from the run folder, itself, or one checkpoint."""
    path = Path(path)
    if (path / RECORD_FILE).is_file():
        return path.resolve().parent
    run_checkpoints = PretrainLayout(path).checkpoints
    return run_checkpoints if run_checkpoints.is_dir() else path


def revision_entry(folder: Path, root: Path) -> dict:
    """One line of the revisions index, from the export's own record."""
    record = json.loads((folder / PROVENANCE_FILE).read_text())
    training, equivalence = record["training"], record["equivalence"]
    validation = training["validation"]
    return {"step": record["step"], "folder": folder.relative_to(root).as_posix(),
            "tokens_seen": training["tokens_seen"], "samples_consumed": training["samples_consumed"],
            "validation_loss": validation.get("eval/mlm_loss"), "validation_step": validation.get("step"),
            "unigram_entropy": validation.get("eval/unigram_entropy"),
            "max_logit_difference": equivalence["max_logit_difference"],
            "top1_agreement": equivalence["top1_agreement"], "checkpoint": record["checkpoint"]}


def _read_index(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise PipelineError(f"{path}: cannot read the revisions index ({err}); move it away to rebuild it") from None
    return entries if isinstance(entries, list) else []


def export_for_loading(path: str | Path, *, export_to: Path | None = None, cache_dir: str | Path | None = None,
                       is_main: bool = True, barrier: Callable[[], None] = lambda: None, keep_export: bool = False,
                       model: str | None = None) -> Path:
    """The HF folder of a pretraining run's last complete checkpoint (or of a checkpoint), exported once: into
    `export_to` when the caller names the folder (fine-tuning's `source_model/`), else into a cache keyed by the
    checkpoint's path and fingerprint, so a second load is instant and never rewrites an earlier export.

    The exporter every command hands `pipeline.models.model_source.resolve_model_source`. Only the main process
    exports; the others wait at `barrier` and then read the finished folder, since several processes exporting into
    one folder would race on its temporary and final names. `keep_export` (finished seeds were fine-tuned from the
    weights in `export_to`): an export of another checkpoint there is refused, on every process, rather than
    replaced. `model` is the argument as the user gave it, for errors.
    """
    checkpoint = resolve_checkpoint(Path(path)).resolve()
    if export_to is None:
        return _export_cached(checkpoint, Path(cache_dir) if cache_dir else default_cache_dir())
    return _export_into(checkpoint, export_to, model or str(path), is_main, barrier, keep_export)


def default_cache_dir() -> Path:
    """`$ROBERTA_PIPELINE_CACHE`, else `~/.cache/roberta-pipeline`: where on-the-fly exports are kept."""
    return Path(os.environ.get("ROBERTA_PIPELINE_CACHE") or Path.home() / ".cache" / "roberta-pipeline")


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

        export_checkpoint(checkpoint, export_to, overwrite=True)
        print(f"exported {checkpoint} to {export_to} (rank {os.environ.get('RANK', '0')})", flush=True)
    barrier()
    return export_to


def _export_cached(checkpoint: Path, cache_dir: Path) -> Path:
    """Export `checkpoint` once into the cache; later loads reuse the folder."""
    identity = exported_identity(checkpoint)  # path and fingerprint: a retrained run's same-named step is another
    run = PretrainLayout.of_checkpoint(checkpoint)
    if run and exported_from(run.export) == identity:
        return run.export  # the run's own export is of this very checkpoint
    key = hashlib.sha256(":".join(identity).encode()).hexdigest()[:16]
    out = cache_dir / "exports" / f"{checkpoint.name}-{key}"
    if not (out / "config.json").is_file():
        export_checkpoint(checkpoint, out, overwrite=True)
    return out
