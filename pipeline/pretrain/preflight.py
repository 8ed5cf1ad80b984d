"""Before a pretraining run starts: its config, the run it plans, this machine, and the files it names.

`load_pretrain_config` builds the config (each section checks itself: config.py), then adds, in one
ConfigError with every problem naming its key, the run's plan on this world size (`plan_problems`), what
this machine lacks (`machine_problems`) and, with `check_files`, the files (`file_problems`): shard
indexes, the tokenizer, `model.init_from`'s folder and the checkpoint a resume or an anneal starts from.
The command runs it before any process group, model or engine exists; `check_files=False` checks a
config whose data does not exist here (the ablation runner, tests of shipped configs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.common.errors import PipelineError
from pipeline.common.run_kernel import load_config
from pipeline.data.tokenizer import TokenizerInfo, describe_tokenizer, load_tokenizer
from pipeline.pretrain import checkpoints
from pipeline.pretrain.batch_plan import batch_problem, ramp_problems
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.phases import phase_ends
from pipeline.pretrain.schedules import wsd_decay_steps


def load_pretrain_config(path: str | Path, overrides: list[str] = (), *, world_size: int = 1, cuda: bool = False,
                         check_files: bool = True) -> PretrainConfig:
    """Read, override and check a pretraining config for a run of `world_size` ranks; all problems in one error.

    The files are read only with `check_files` and when every key and type is right (a wrong value's default
    stands in for it, and would send the checks to the wrong files).
    """
    return load_config(PretrainConfig, path, overrides, lambda config, typed: preflight_problems(
        config, world_size=world_size, cuda=cuda, check_files=check_files and typed))


def preflight_problems(config: PretrainConfig, *, world_size: int, cuda: bool, check_files: bool) -> list[str]:
    """What the config cannot tell alone: the plan on `world_size` ranks, this machine, and (`check_files`) files."""
    problems = plan_problems(config, world_size=world_size, cuda=cuda) + machine_problems(config, cuda=cuda)
    if check_files:
        problems += file_problems(config)
    return problems


def plan_problems(config: PretrainConfig, *, world_size: int, cuda: bool) -> list[str]:
    """The run's arithmetic as this config and launch give it: phase steps, the decay's length, batches."""
    t, s = config.train, config.schedule
    problems = phase_step_problems(config, world_size) if config.phases else []
    if not config.phases and (problem := batch_problem(t.global_batch_size, t.micro_batch_size, world_size)):
        problems.append(problem)  # with phases, each phase's batch is checked in phase_step_problems
    fraction_ok = s.decay_fraction is None or 0 <= s.decay_fraction <= 1  # else the schedule section says so
    if s.kind == "wsd" and fraction_ok and t.max_steps >= 1 \
            and s.warmup_steps + wsd_decay_steps(s, t.max_steps) > t.max_steps:
        problems.append(f"schedule.warmup_steps {s.warmup_steps} + the decay's {wsd_decay_steps(s, t.max_steps)} "
                        f"steps exceed train.max_steps {t.max_steps}; shorten one of them")
    problems += ramp_problems(t.global_batch_size, t.batch_warmup_start, t.batch_warmup_tokens, t.micro_batch_size,
                              world_size)
    if t.precision == "fp16" and not cuda:
        problems.append("train.precision: fp16 needs a GPU (DeepSpeed does not support it on CPU); use bf16 on a "
                        "CPU with native bf16, fp32 elsewhere")
    if config.model.attn_implementation == "flex_attention" and not cuda:  # torch raises at the first backward
        problems.append("model.attn_implementation flex_attention: FlexAttention has no backward on CPU, so it "
                        "cannot train there; use sdpa on CPU (packed documents work with it too)")
    return problems


def phase_step_problems(config: PretrainConfig, world_size: int) -> list[str]:
    """Each phase's steps (phases.py's `phase_ends`), its batch on `world_size` ranks, its warmup and decay in them."""
    problems = []
    add = problems.append
    t, s = config.train, config.schedule
    ends = phase_ends([p.steps_fraction for p in config.phases], max(t.max_steps, 1))
    for i, (p, start, end) in enumerate(zip(config.phases, [0, *ends], ends, strict=False)):
        key = f"phases[{i}]"
        if 0 < p.steps_fraction <= 1 and end <= start:
            add(f"{key}.steps_fraction {p.steps_fraction} of train.max_steps {t.max_steps} gives the phase 0 steps "
                f"(steps {start} to {end}); raise its fraction or train.max_steps, or drop the phase")
        problem = batch_problem(t.global_batch_size if p.global_batch_size is None else p.global_batch_size,
                                t.micro_batch_size if p.micro_batch_size is None else p.micro_batch_size, world_size,
                                keys=(f"{key}.global_batch_size (or train.global_batch_size)",
                                      f"{key}.micro_batch_size (or train.micro_batch_size)"))
        if problem:
            add(problem)
        warmup, source = ((p.warmup_steps, f"{key}.warmup_steps") if p.warmup_steps is not None
                          else (s.warmup_steps, f"schedule.warmup_steps (the default of {key})"))
        if not 0 <= warmup <= max(end - start, 0):
            add(f"{source} {warmup} must be between 0 and the phase's {end - start} steps")
        if s.kind == "wsd" and end > start:
            decay, source = ((p.decay_steps, f"{key}.decay_steps") if p.decay_steps is not None else
                             (wsd_decay_steps(s, end - start), "the schedule's decay"))
            if not 0 <= decay <= max(end - start - warmup, 0):
                add(f"{source} ({decay} steps) must be between 0 and the {end - start - warmup} steps that {key}'s "
                    "warmup leaves")
    return problems


def machine_problems(config: PretrainConfig, *, cuda: bool) -> list[str]:
    """What this machine lacks for the config: a compiler for `train.compile`, Triton for FlexAttention on GPU
    (transformers runs it through torch.compile)."""
    problems = []
    if config.train.compile and (problem := inductor_problem("train.compile", "train.compile=false", cuda=cuda)):
        problems.append(problem)
    if config.model.attn_implementation == "flex_attention" and cuda:
        if problem := inductor_problem("model.attn_implementation flex_attention", "model.attn_implementation=sdpa",
                                       cuda=cuda):
            problems.append(problem)
    return problems


def inductor_problem(key: str, fix: str, *, cuda: bool) -> str | None:
    """Why inductor cannot compile here (no Triton on GPU, no C++ compiler on CPU) as a problem of `key`, or None."""
    if cuda:
        from torch.utils._triton import has_triton

        if not has_triton():
            return f"{key}: torch.compile on GPU needs Triton, which is not installed; install triton or set {fix}"
        return None
    from torch._inductor import exc
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        return (f"{key}: torch.compile on CPU needs a C++ compiler (g++ or clang++ on PATH, or $CXX); install one "
                f"or set {fix}")
    return None


def file_problems(config: PretrainConfig) -> list[str]:
    """The shard folders, the tokenizer, `model.init_from` and the checkpoint the run starts from."""
    problems, indexes = index_problems(config)
    tokenizer = info = None
    if config.data.tokenizer and not problems and indexes:
        try:
            tokenizer = load_tokenizer(config.data.tokenizer)
            info = describe_tokenizer(tokenizer, config.data.tokenizer)
        except PipelineError as err:
            problems.append(f"data.tokenizer: {err}")
    if info is not None:
        problems += data_problems(config, tokenizer, info, indexes)
    return problems + start_problems(config, info)


def index_problems(config: PretrainConfig) -> tuple[list[str], dict[str, dict]]:
    """Each shard folder's index.json, read and checked (data/shard_index.py); the problems and the indexes."""
    from pipeline.data.shard_index import load_index

    if config.phases:
        key, folders = "phases[{}].shards", [p.shards for p in config.phases]
    else:
        key = "data.shards" if not config.data.mixed else "data.shards[{}].path"
        folders = [source.path for source in config.data.corpora()] if config.data.shards else []
    indexes, problems = {}, []
    for i, folder in enumerate(folders):
        if folder and folder not in indexes:
            try:
                indexes[folder] = load_index(folder)
            except PipelineError as err:
                problems.append(f"{key.format(i)}: {err}")
    return problems, indexes


def data_problems(config: PretrainConfig, tokenizer, info, indexes: dict[str, dict]) -> list[str]:
    """The shard folders against each other, the tokenizer and the model, without loading shards."""
    problems = []
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
        if config.data.mixed and index["splits"]["train"]["sequences"] == 0:
            problems.append(f"data.shards: {folder} has no train sequences")
    if config.phases:
        problems += phase_file_problems(config, indexes)
    train = sum(index["splits"]["train"]["sequences"] for index in indexes.values())
    if not config.data.mixed and not config.phases and train < config.train.global_batch_size:
        problems.append(f"data.shards: the train split holds {train} sequences, fewer than one global batch "
                        f"(train.global_batch_size {config.train.global_batch_size})")
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


SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
"""The model's shape: `model.*` keys that are also the HF config's names, so a checkpoint's `hf_config` holds them."""


# A checkpoint holds an optimizer's state, a model of one architecture and shape, and an embedding table of one
# vocabulary; loading it under a config that says otherwise fails deep inside DeepSpeed or torch (a StableAdamW
# state under AdamW: `KeyError: 'step'` at the first step), or trains on with the wrong vocabulary. These checks
# read only the checkpoint's `complete.json` and a folder's `config.json`, and name both sides of each mismatch;
# the checksums of a resume's files are the checkpointer's, when it loads them.
def start_problems(config: PretrainConfig, tokenizer: TokenizerInfo | None) -> list[str]:
    """The checkpoint this run starts from (a resume's, else an anneal's) against `config` and the tokenizer
    (None: it did not load, a problem reported on its own)."""
    own = _newest_readable(config.layout.checkpoints) if config.checkpoint.resume == "auto" else None
    if own is not None:
        checkpoint, marker = own
        return marker_problems(config, checkpoint, marker, tokenizer, resume=True)
    if not config.train.anneal_from:
        return []
    try:
        checkpoint = checkpoints.resolve_checkpoint(config.train.anneal_from)
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
    """The optimizer, architecture, vocabulary and shape `checkpoint` was trained with, against `config`
    (each one its marker records: older checkpoints lack some)."""
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
