"""The pretraining config's checks against files: shard indexes, the tokenizer and `model.init_from`.

`pipeline/pretrain/config.py` decides whether a config is valid as written; these checks open what
it points at (without loading any shard or weight) and run only when `check_files` is on, so a
config can be validated where its data does not exist.
"""

from __future__ import annotations

from pipeline.common.errors import PipelineError
from pipeline.pretrain.config import PretrainConfig


def data_problems(config: PretrainConfig) -> list[str]:
    """Check the shard folders and tokenizer against each other and the model, without loading shards."""
    from pipeline.data.shard_index import load_index
    from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer

    if config.phases:
        key, folders = "phases[{}].shards", [p.shards for p in config.phases]
    else:
        key = "data.shards" if not config.data.mixed else "data.shards[{}].path"
        folders = [source.path for source in config.data.corpora()]
    indexes = {}
    problems = []
    for i, folder in enumerate(folders):
        if folder and folder not in indexes:
            try:
                indexes[folder] = load_index(folder)
            except PipelineError as err:
                problems.append(f"{key.format(i)}: {err}")
    if problems or not indexes:
        return problems
    try:
        tokenizer = load_tokenizer(config.data.tokenizer)
        info = describe_tokenizer(tokenizer, config.data.tokenizer)
    except PipelineError as err:
        return [f"data.tokenizer: {err}"]
    if config.masking.unit != "token":
        from pipeline.pretrain.word_starts import word_rule

        try:
            word_rule(tokenizer)
        except PipelineError as err:
            problems.append(f"masking.unit {config.masking.unit}: {err}")
    (first, first_index), *others = indexes.items()
    for folder, index in others if config.data.mixed else ():  # a mix feeds one model: one length, one layout
        for entry, what in (("seq_len", "sequence length"), ("pack", "packing")):
            if index[entry] != first_index[entry]:
                problems.append(f"data.shards: mixed corpora must share one {what}: {first} has {entry} "
                                f"{first_index[entry]!r}, {folder} has {entry} {index[entry]!r}; re-shard one of them")
        if index["tokenizer"]["fingerprint"] != first_index["tokenizer"]["fingerprint"]:
            problems.append(f"data.shards: mixed corpora must share one tokenizer: {first} was made with "
                            f"{first_index['tokenizer']['name']} ({first_index['tokenizer']['fingerprint'][:19]}…), "
                            f"{folder} with {index['tokenizer']['name']} "
                            f"({index['tokenizer']['fingerprint'][:19]}…)")
    for folder, index in indexes.items():
        if info.fingerprint != index["tokenizer"]["fingerprint"]:
            problems.append(f"data.tokenizer {config.data.tokenizer} is not the tokenizer data.shards "
                            f"{folder} was made with ({index['tokenizer']['name']})")
        if config.model.architecture == "bert" and config.model.next_sentence_loss and index["pack"] != "pairs":
            problems.append(f"model.architecture is bert with model.next_sentence_loss true (MLM + next-sentence "
                            f"prediction), which needs shards packed with --pack pairs; {folder} holds "
                            f"{index['pack']!r} sequences: re-shard with --pack pairs, or set "
                            "model.next_sentence_loss false to train MLM alone on them")
        if index["splits"]["val"]["sequences"] == 0:
            held_out = index["totals"].get("val_documents", 0)
            problems.append(f"data.shards: {folder} has no validation sequences ({held_out} documents held out "
                            f"with --val-fraction {index['args'].get('val_fraction')}); re-run data_prep/shard.py "
                            "with a larger --val-fraction (and --overwrite), or on more text")
    if config.phases:
        problems += phase_file_problems(config, indexes)
    train = sum(index["splits"]["train"]["sequences"] for index in indexes.values())
    if not config.data.mixed and not config.phases and train < config.train.global_batch_size:
        problems.append(f"data.shards: the train split holds {train} sequences, fewer than one global batch "
                        f"(train.global_batch_size {config.train.global_batch_size})")
    for folder, index in indexes.items():
        if config.data.mixed and index["splits"]["train"]["sequences"] == 0:
            problems.append(f"data.shards: {folder} has no train sequences")
    if config.model.init_from:  # positions are sized for the longest phase
        problems += init_from_problems(config, info, max(index["seq_len"] for index in indexes.values()))
    return problems


def phase_file_problems(config: PretrainConfig, indexes: dict[str, dict]) -> list[str]:
    """Each phase against its folder's index: the seq_len it states, a train split of at least one batch."""
    problems = []
    for i, phase in enumerate(config.phases):
        index = indexes.get(phase.shards)
        if index is None:
            continue
        if phase.seq_len is not None and index["seq_len"] != phase.seq_len:
            problems.append(f"phases[{i}].seq_len is {phase.seq_len}, but phases[{i}].shards {phase.shards} holds "
                            f"sequences of {index['seq_len']} tokens (its index.json); point the phase at shards "
                            f"made with --seq-len {phase.seq_len}, or correct the seq_len")
        batch = phase.global_batch_size or config.train.global_batch_size
        train = index["splits"]["train"]["sequences"]
        if train < batch:
            problems.append(f"phases[{i}].shards: the train split of {phase.shards} holds {train} sequences, fewer "
                            f"than one global batch of the phase ({batch})")
    return problems


# The HF `model_type` that continued pretraining of each architecture can start from.
INIT_FROM_MODEL_TYPES = {"roberta": "roberta", "bert": "bert", "roberta-prelayernorm": "roberta-prelayernorm",
                         "modernbert": "modernbert"}


def init_from_problems(config: PretrainConfig, tokenizer, seq_len: int) -> list[str]:
    """Check `model.init_from` weights against the tokenizer and the shards before any weights are loaded.

    Continued pretraining (fairseq's README: start from a released checkpoint) only makes sense with the
    tokenizer those weights were trained with, and position embeddings long enough for the shards.
    """
    from transformers import AutoConfig

    from pipeline.common.hub_names import local_or_hub

    source = config.model.init_from
    try:
        hf = AutoConfig.from_pretrained(local_or_hub(source, "model.init_from"))
    except PipelineError as err:
        return [str(err)]
    except (OSError, ValueError) as err:
        return [f"model.init_from {source}: cannot read its config.json ({str(err).splitlines()[0][:200]})"]
    problems = []
    want = INIT_FROM_MODEL_TYPES[config.model.architecture]
    if hf.model_type != want:
        problems.append(f"model.init_from {source}: holds a {hf.model_type!r} model, model.architecture is "
                        f"{config.model.architecture!r} (expects {want!r})")
    if hf.vocab_size != tokenizer.vocab_size:
        problems.append(f"model.init_from {source}: its vocabulary has {hf.vocab_size} tokens, data.tokenizer "
                        f"{config.data.tokenizer} has {tokenizer.vocab_size}; continue pretraining with the "
                        "tokenizer those weights were trained with")
    if hf.pad_token_id is not None and hf.pad_token_id != tokenizer.pad_id:
        problems.append(f"model.init_from {source}: its pad id is {hf.pad_token_id}, data.tokenizer's is "
                        f"{tokenizer.pad_id}; the special ids must agree")
    # RoBERTa numbers positions from pad_id + 1 (see pipeline/pretrain/model.py hf_config).
    needed = seq_len + (tokenizer.pad_id + 1 if config.model.architecture == "roberta" else 0)
    if hf.max_position_embeddings < needed:
        problems.append(f"model.init_from {source}: has {hf.max_position_embeddings} position embeddings, the "
                        f"shards' seq_len {seq_len} needs {needed}; shard with --seq-len "
                        f"{hf.max_position_embeddings - (needed - seq_len)} or less")
    return problems

