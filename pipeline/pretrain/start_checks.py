"""What a run starts from, against its config: state a checkpoint or a weights folder cannot give.

A run starts from its own newest complete checkpoint (`checkpoint.resume: auto`), else from
`train.anneal_from`'s, else from `model.init_from`'s HF folder or random weights. A checkpoint holds
an optimizer's state, a model of one architecture and shape, and an embedding table of one vocabulary;
loading it under a config that says otherwise fails deep inside DeepSpeed or torch (a StableAdamW
state under AdamW: `KeyError: 'step'` at the first step), or trains on with the wrong vocabulary.
These checks read only the checkpoint's completion marker (`complete.json`: its `config`,
`architecture` and `hf_config`) and the folder's `config.json`, and name both sides of each mismatch.
The checksums of a resume's files are the checkpointer's, when it loads them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.common.errors import PipelineError
from pipeline.data.tokenizer import TokenizerInfo
from pipeline.pretrain import checkpoints
from pipeline.pretrain.anneal import source_checkpoint
from pipeline.pretrain.config import PretrainConfig

SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
"""The model's shape: `model.*` keys that are also the HF config's names, so a checkpoint's `hf_config` holds them."""


def start_problems(config: PretrainConfig, tokenizer: TokenizerInfo | None) -> list[str]:
    """The checkpoint this run starts from (a resume's, else an anneal's) against `config` and the tokenizer.

    `tokenizer` is None when it could not be loaded (that problem is reported on its own).
    """
    own = _newest_readable(config.layout.checkpoints) if config.checkpoint.resume == "auto" else None
    if own is not None:
        checkpoint, marker = own
        return marker_problems(config, checkpoint, marker, tokenizer, resume=True)
    if not config.train.anneal_from:
        return []
    try:
        checkpoint = source_checkpoint(config)
        marker = checkpoints.read_marker(checkpoint)
    except PipelineError as err:
        return [f"train.anneal_from: {err}"]
    t = config.train
    problems = []
    if checkpoint.resolve().is_relative_to(config.layout.checkpoints.resolve()):
        problems.append(f"train.anneal_from {checkpoint} is inside this run's own train.output_dir; the anneal "
                        "writes into its own folder: give it another train.output_dir")
    saved = marker.get("batch_plan", {}).get("global_batch_size")
    if saved != t.global_batch_size and not t.batch_warmup_tokens:  # with one, the checkpointer checks its step's
        problems.append(f"train.anneal_from {checkpoint} was trained with global batch {saved}, "
                        f"train.global_batch_size is {t.global_batch_size}; the data stream continues only at the "
                        f"same global batch: set train.global_batch_size={saved}")
    return problems + marker_problems(config, checkpoint, marker, tokenizer, resume=False)


def marker_problems(config: PretrainConfig, checkpoint: Path, marker: dict[str, Any],
                    tokenizer: TokenizerInfo | None, *, resume: bool) -> list[str]:
    """The optimizer, architecture, vocabulary and shape `checkpoint` was trained with, against `config`.

    A checkpoint written before the marker recorded one of them is not checked on it.
    """
    recorded = marker.get("config") if isinstance(marker.get("config"), dict) else {}
    hf = marker.get("hf_config") if isinstance(marker.get("hf_config"), dict) else {}
    if resume:
        where = f"checkpoint.resume auto: this run's checkpoint {checkpoint}"
        fix = "a resume continues that run: set it back, or give this run another train.output_dir"
    else:
        where = f"train.anneal_from: checkpoint {checkpoint}"
        fix = "an anneal continues the checkpoint's model and optimizer: set it to the checkpoint's"
    problems = []
    optimizer = (recorded.get("optimizer") or {}).get("name") if isinstance(recorded.get("optimizer"), dict) else None
    if optimizer is not None and optimizer != config.optimizer.name:
        problems.append(f"{where} was trained with optimizer {optimizer}; this config says {config.optimizer.name} "
                        f"(optimizer.name), whose state cannot be loaded from it; {fix}")
    architecture = marker.get("architecture")
    if architecture is not None and architecture != config.model.architecture:
        problems.append(f"{where} holds a {architecture} model; this config says {config.model.architecture} "
                        f"(model.architecture); {fix}")
    vocab = hf.get("vocab_size")
    if tokenizer is not None and vocab is not None and vocab != tokenizer.vocab_size:
        problems.append(f"{where} has a vocabulary of {vocab} tokens; data.tokenizer {config.data.tokenizer} has "
                        f"{tokenizer.vocab_size}; train with the tokenizer the checkpoint was trained with")
    if architecture == config.model.architecture and not config.model.init_from:  # init_from: the folder's shape
        for key in SHAPE_KEYS:
            saved = hf.get(key)
            if saved is not None and saved != getattr(config.model, key):
                problems.append(f"{where} has {key} {saved}; this config says {getattr(config.model, key)} "
                                f"(model.{key}); {fix}")
    return problems


def init_from_problems(config: PretrainConfig, tokenizer: TokenizerInfo, seq_len: int) -> list[str]:
    """Check `model.init_from` weights against the tokenizer and the shards before any weights are loaded.

    Continued pretraining (fairseq's README: start from a released checkpoint) only makes sense with the
    tokenizer those weights were trained with, and position embeddings long enough for the shards.
    """
    from transformers import AutoConfig

    from pipeline.common.hub_names import local_or_hub
    from pipeline.pretrain.model import first_position_id

    source = config.model.init_from
    try:
        hf = AutoConfig.from_pretrained(local_or_hub(source, "model.init_from"))
    except PipelineError as err:
        return [str(err)]
    except (OSError, ValueError) as err:
        return [f"model.init_from {source}: cannot read its config.json ({str(err).splitlines()[0][:200]})"]
    problems = []
    # The architectures' names are transformers' model_type names.
    if hf.model_type != config.model.architecture:
        problems.append(f"model.init_from {source}: holds a {hf.model_type!r} model, model.architecture is "
                        f"{config.model.architecture!r}")
    if hf.vocab_size != tokenizer.vocab_size:
        problems.append(f"model.init_from {source}: its vocabulary has {hf.vocab_size} tokens, data.tokenizer "
                        f"{config.data.tokenizer} has {tokenizer.vocab_size}; continue pretraining with the "
                        "tokenizer those weights were trained with")
    if hf.pad_token_id is not None and hf.pad_token_id != tokenizer.pad_id:
        problems.append(f"model.init_from {source}: its pad id is {hf.pad_token_id}, data.tokenizer's is "
                        f"{tokenizer.pad_id}; the special ids must agree")
    # RoBERTa numbers positions from pad_id + 1 (see pipeline/pretrain/model.py hf_config).
    needed = seq_len + first_position_id(config.model.architecture, tokenizer.pad_id)
    if hf.max_position_embeddings < needed:
        problems.append(f"model.init_from {source}: has {hf.max_position_embeddings} position embeddings, the "
                        f"shards' seq_len {seq_len} needs {needed}; shard with --seq-len "
                        f"{hf.max_position_embeddings - (needed - seq_len)} or less")
    return problems


def _newest_readable(root: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint under `root` whose marker reads, and the marker (a damaged one the
    checkpointer sets aside, so the one before it is where the resume starts)."""
    for folder in reversed(checkpoints.complete_checkpoints(root)):
        try:
            return folder, checkpoints.read_marker(folder)
        except PipelineError:
            continue
    return None
