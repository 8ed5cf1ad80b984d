"""Before a pretraining run starts: its config, this machine, the files it names, and the plan it makes of them.

`prepare_run` builds the config (each section checks itself: config.py), then adds, in one ConfigError
with every problem naming its key, the run's arithmetic on this world size (`arithmetic_problems`), what
this machine lacks (`machine_problems`) and the files (`read_files`): shard indexes, the tokenizer,
`model.init_from`'s folder and the checkpoint the run starts from (checkpointer.py), and whatever
`file_checks` its caller adds (the command's: the probe files, pipeline/hub/quality_probes.py). From those it
builds the run's plan (plan/run_plan.py), once. The command runs it before any process group,
model or engine exists; `load_pretrain_config(check_files=False)` checks a config whose data does not exist here
(the ablation runner, tests of shipped configs).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.common.config.tree import ConfigError, SectionProblems
from pipeline.common.errors import PipelineError
from pipeline.common.processes.batch_plan import batch_problem, ramp_problems
from pipeline.common.run_kernel import load_config
from pipeline.data.epoch_order import CorpusLayout, default_shards_per_block
from pipeline.data.tokenizer import TokenizerInfo, describe_tokenizer, load_tokenizer
from pipeline.pretrain.checkpointer import Start, find_start
from pipeline.pretrain.checkpoints.ledger import Ledger, read_ledger
from pipeline.pretrain.config import PretrainConfig, named_corpora
from pipeline.pretrain.plan.phases import resolve_phases
from pipeline.pretrain.plan.run_plan import PlanError, RunPlan, build_plan
from pipeline.pretrain.plan.schedules import wsd_decay_steps
from pipeline.pretrain.step.compile_blocks import inductor_problem

FileChecks = Sequence[Callable[[PretrainConfig], list[str]]]
"""More files to check with the rest, each check's problems naming their key."""


def prepare_run(path: str | Path, overrides: list[str] = (), *, world_size: int = 1, cuda: bool = False,
                file_checks: FileChecks = ()) -> RunPlan:
    """The checked config and its plan for a run of `world_size` ranks; all problems in one error."""
    return _preflight(path, overrides, world_size, cuda, True, file_checks)[1]


def load_pretrain_config(path: str | Path, overrides: list[str] = (), *, world_size: int = 1, cuda: bool = False,
                         check_files: bool = True, file_checks: FileChecks = ()) -> PretrainConfig:
    """Read, override and check a pretraining config for a run of `world_size` ranks; all problems in one error.

    With `check_files` the files are read and the run planned (when every key and type is right: a wrong
    value's default stands in for it, and would send the checks to the wrong files).
    """
    return _preflight(path, overrides, world_size, cuda, check_files, file_checks)[0]


def _preflight(path, overrides, world_size: int, cuda: bool, check_files: bool,
               file_checks: FileChecks) -> tuple[PretrainConfig, RunPlan | None]:
    found = []

    def checks(config: PretrainConfig, typed: bool) -> list[str]:
        problems = arithmetic_problems(config, world_size=world_size, cuda=cuda) + machine_problems(config, cuda=cuda)
        if check_files and typed:
            more, *files = read_files(config, world_size)
            found.append(files)  # (layouts, start, ledger)
            problems += more + [problem for check in file_checks for problem in check(config)]
        return problems

    config = load_config(PretrainConfig, path, overrides, checks)
    if not check_files:
        return config, None
    try:  # what only the whole plan shows (a corpus's share of a batch, a skip past the end), in the same form
        layouts, start, ledger = found[0]
        return config, build_plan(config, world_size, layouts, start.point, start.rolled_back, start.anneal_from,
                                  ledger)
    except PlanError as err:
        raise ConfigError(str(path), err.problems) from None


def recorded_plan(run_dir: str | Path) -> RunPlan:
    """An existing run's plan, as its newest checkpoint records it: the stream it trained on up to that step, then
    what its config (`config.json`, written at every start) plans from there. What a trace reads."""
    from pipeline.common.run_layout import PretrainLayout

    layout = PretrainLayout(Path(run_dir))
    if not layout.config.is_file():
        raise PipelineError(f"{run_dir}: no config.json; expected a pretraining run folder (train.output_dir)")
    config = load_pretrain_config(layout.config, check_files=False)
    problems, layouts, start, ledger = read_files(config, 1, check_data=False)
    if problems:
        raise ConfigError(str(layout.config), problems)
    return build_plan(config, 1, layouts, start.point, anneal_from=start.anneal_from, ledger=ledger)


def arithmetic_problems(config: PretrainConfig, *, world_size: int, cuda: bool) -> list[str]:
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
    try:
        phases = resolve_phases(config)  # every default filled in there
    except SectionProblems:  # a phase's mix its own section refused: reported there
        return []
    for p, written in zip(phases, config.phases, strict=True):
        key, start, end = f"phases[{p.index}]", p.start, p.end
        if 0 < written.steps_fraction <= 1 and end <= start:
            add(f"{key}.steps_fraction {written.steps_fraction} of train.max_steps {t.max_steps} gives the phase 0 "
                f"steps (steps {start} to {end}); raise its fraction or train.max_steps, or drop the phase")
        problem = batch_problem(p.global_batch_size, p.micro_batch_size, world_size,
                                keys=(f"{key}.global_batch_size (or train.global_batch_size)",
                                      f"{key}.micro_batch_size (or train.micro_batch_size)"))
        if problem:
            add(problem)
        source = f"{key}.warmup_steps" if written.warmup_steps is not None else \
            f"schedule.warmup_steps (the default of {key})"
        if not 0 <= p.warmup_steps <= max(end - start, 0):
            add(f"{source} {p.warmup_steps} must be between 0 and the phase's {end - start} steps")
        if s.kind == "wsd" and end > start:
            decay, source = ((p.decay_steps, f"{key}.decay_steps") if p.decay_steps is not None else
                             (wsd_decay_steps(s, end - start), "the schedule's decay"))
            if not 0 <= decay <= max(end - start - p.warmup_steps, 0):
                add(f"{source} ({decay} steps) must be between 0 and the {end - start - p.warmup_steps} steps "
                    f"that {key}'s warmup leaves")
    return problems


def machine_problems(config: PretrainConfig, *, cuda: bool) -> list[str]:
    """What this machine lacks for the config: a compiler for `train.compile`, Triton for FlexAttention on GPU
    (transformers runs it through torch.compile)."""
    problems = []
    if config.train.compile is True and (problem := inductor_problem("train.compile", "train.compile=false",
                                                                     cuda=cuda)):
        problems.append(problem)
    if config.model.attn_implementation == "flex_attention" and cuda:
        if problem := inductor_problem("model.attn_implementation flex_attention", "model.attn_implementation=sdpa",
                                       cuda=cuda):
            problems.append(problem)
    return problems


def read_files(config: PretrainConfig, world_size: int, *, check_data: bool = True) -> tuple[
        list[str], dict[str, CorpusLayout], Start, Ledger]:
    """The shard folders, the tokenizer, `model.init_from`, the run's ledger and the checkpoints the run starts
    from: the problems, each folder's layout, the start (with this run's checkpoints that a skipped range rolls
    back, and the anneal's source) and the ledger. Without `check_data` (a run that trained: its trace), only the
    indexes, the ledger and the checkpoints."""
    problems, indexes = index_problems(config)
    ledger = Ledger(config.layout.ledger)
    try:  # the run folder's, whatever checkpoint.resume says: its skipped ranges stay skipped
        ledger = read_ledger(config.layout.ledger)
    except PipelineError as err:
        problems.append(f"train.output_dir: {err}")
    tokenizer = info = None
    if check_data and config.data.tokenizer and not problems and indexes:
        try:
            tokenizer = load_tokenizer(config.data.tokenizer)
            info = describe_tokenizer(tokenizer, config.data.tokenizer)
        except PipelineError as err:
            problems.append(f"data.tokenizer: {err}")
    if info is not None:
        problems += data_problems(config, tokenizer, info, indexes)
    start = find_start(config, info, world_size, ledger.skipped)
    layouts = {folder: corpus_layout(folder, index) for folder, index in indexes.items()}
    return problems + start.problems, layouts, start, ledger


def corpus_layout(folder: str, index: dict) -> CorpusLayout:
    """A folder's training split as the order sees it; its key comes from the shards' checksums."""
    shards = index["splits"]["train"]["shards"]
    digest = hashlib.sha256(json.dumps([s.get("sha256") for s in shards]).encode()).hexdigest()
    sizes = tuple(int(s["sequences"]) for s in shards)
    return CorpusLayout(name=Path(folder).name, path=folder, key=int(digest[:12], 16), shard_sizes=sizes,
                        shards_per_block=default_shards_per_block(sizes, index["seq_len"]), seq_len=index["seq_len"])


def data_groups(config: PretrainConfig) -> list[tuple[str, str | list, int | None, int]]:
    """Where the config names shard folders: each `phases[i]`, or `data`, with its folder or mix, the seq_len it
    states and its global batch."""
    t = config.train
    if config.phases:
        return [(f"phases[{i}]", p.shards, p.seq_len, p.global_batch_size or t.global_batch_size)
                for i, p in enumerate(config.phases)]
    return [("data", config.data.shards, None, t.global_batch_size)] if config.data.shards else []


def index_problems(config: PretrainConfig) -> tuple[list[str], dict[str, dict]]:
    """Each shard folder's index.json, read and checked (data/shard_index.py); the problems and the indexes."""
    from pipeline.data.shards.index import load_index

    indexes, problems = {}, []
    for key, shards, *_ in data_groups(config):
        for j, source in enumerate(named_corpora(shards)):
            if source.path and source.path not in indexes:
                try:
                    indexes[source.path] = load_index(source.path)
                except PipelineError as err:
                    where = f"{key}.shards[{j}].path" if isinstance(shards, list) else f"{key}.shards"
                    problems.append(f"{where}: {err}")
    return problems, indexes


def contrastive_problems(config: PretrainConfig, folder: str, index: dict) -> list[str]:
    """Whether the shards in `folder` hold documents the span-contrastive term can draw two spans from."""
    c = config.contrastive
    if not c.on:
        return []
    if index["pack"] == "pairs":
        return [f"contrastive.weight: {folder} holds 'pairs' rows (two segments, often of two documents), no document "
                "to draw spans from; train on shards packed full, doc or doc-packed, or set contrastive.weight 0"]
    if index["seq_len"] < c.min_document_tokens:
        return [f"contrastive.min_document_tokens: {c.min_document_tokens} is more than the {index['seq_len']} tokens "
                f"of a row of {folder}, so no document would hold spans; lower it, or set contrastive.weight 0"]
    return []


def data_problems(config: PretrainConfig, tokenizer, info, indexes: dict[str, dict]) -> list[str]:
    """The shard folders against each other, the tokenizer and the model, without loading shards."""
    problems = []
    if config.masking.unit != "token":
        from pipeline.pretrain.plan.masking import word_rule

        try:
            word_rule(tokenizer)
        except PipelineError as err:
            problems.append(f"masking.unit {config.masking.unit}: {err}")
    for folder, index in indexes.items():
        if info.fingerprint != index["tokenizer"]["fingerprint"]:
            problems.append(f"data.tokenizer {config.data.tokenizer} is not the tokenizer data.shards "
                            f"{folder} was made with ({index['tokenizer']['name']})")
        if config.model.architecture == "bert" and config.model.next_sentence_loss and index["pack"] != "pairs":
            problems.append(f"model.architecture is bert with model.next_sentence_loss true (MLM + next-sentence "
                            f"prediction), which needs shards packed with --pack pairs; {folder} holds "
                            f"{index['pack']!r} sequences: re-shard with --pack pairs, or set "
                            "model.next_sentence_loss false to train MLM alone on them")
        problems += contrastive_problems(config, folder, index)
        if index["splits"]["val"]["sequences"] == 0:
            held_out = index["totals"].get("val_documents", 0)
            problems.append(f"data.shards: {folder} has no validation sequences ({held_out} documents held out "
                            f"with --val-fraction {index['args'].get('val_fraction')}); re-run data_prep/shard.py "
                            "with a larger --val-fraction (and --overwrite), or on more text")
        if index["splits"]["train"]["sequences"] == 0:
            problems.append(f"data.shards: {folder} has no train sequences")
    for key, shards, seq_len, batch in data_groups(config):
        found = [(s.path, indexes[s.path]) for s in named_corpora(shards) if s.path in indexes]
        if isinstance(shards, list):  # a mix feeds one model: one length, one packing
            problems += mix_file_problems(f"{key}.shards", found)
        for folder, index in found:
            if seq_len is not None and index["seq_len"] != seq_len:
                problems.append(f"{key}.seq_len is {seq_len}, but {key}.shards {folder} holds sequences of "
                                f"{index['seq_len']} tokens (its index.json); point the phase at shards made with "
                                f"--seq-len {seq_len}, or correct the seq_len")
            train = index["splits"]["train"]["sequences"]
            if not isinstance(shards, list) and 0 < train < batch:  # a mix's corpora each run through their epochs
                problems.append(f"{key}.shards: the train split of {folder} holds {train} sequences, fewer than one "
                                f"global batch ({batch})")
    if config.model.init_from:  # positions are sized for the longest phase
        problems += init_from_problems(config, info, max(index["seq_len"] for index in indexes.values()))
    return problems


def mix_file_problems(key: str, found: list[tuple[str, dict]]) -> list[str]:
    """The corpora of one mix (their folders and indexes) must share a sequence length and a packing (and a
    tokenizer, data.tokenizer's: checked for every folder)."""
    if not found:
        return []
    (first, first_index), *others = found
    return [f"{key}: mixed corpora must share one {what}: {first} has {entry} {first_index[entry]!r}, {folder} has "
            f"{entry} {index[entry]!r}; re-shard one of them"
            for folder, index in others for entry, what in (("seq_len", "sequence length"), ("pack", "packing"))
            if index[entry] != first_index[entry]]


def init_from_problems(config: PretrainConfig, tokenizer: TokenizerInfo, seq_len: int) -> list[str]:
    """Check `model.init_from` weights against the tokenizer and the shards before any weights are loaded.

    Continued pretraining (fairseq's README: start from a released checkpoint) only makes sense with the
    tokenizer those weights were trained with, and position embeddings long enough for the shards.
    """
    from transformers import AutoConfig

    from pipeline.common.hub_names import local_or_hub
    from pipeline.models.architectures.hf_model import first_position_id

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
    # RoBERTa numbers positions from pad_id + 1 (see pipeline/models/architectures/hf_model.py hf_config).
    needed = seq_len + first_position_id(config.model.architecture, tokenizer.pad_id)
    if hf.max_position_embeddings < needed:
        problems.append(f"model.init_from {source}: has {hf.max_position_embeddings} position embeddings, the "
                        f"shards' seq_len {seq_len} needs {needed}; shard with --seq-len "
                        f"{hf.max_position_embeddings - (needed - seq_len)} or less")
    return problems
