"""The pretraining config's checks: every cross-field rule, in one place, run by `pretrain_problems`.

`config.load_pretrain_config` checks types and unknown keys (`config_tree`), then calls
`pretrain_problems`, which runs, in this order:

- `phases`: each phase's steps, batch, LR, warmup, decay and RoPE theta (`phase_problems`);
- the sections' own rules: data, model (ModernBERT's keys), masking, optimizer, schedule, train,
  checkpoint, tracking, precision and ZeRO against this machine, the `deepspeed` section against
  DeepSpeed's config models, and upper bounds from pipeline/common/size_limits.py (`config_problems`);
- `schedule`: the decay's kind, shape and length (`schedule_problems`);
- `train.compile` and `model.attn_implementation: flex_attention`: a C++ compiler on CPU, Triton on
  GPU, not ZeRO-3 (`compile_problems`, `inductor_problem`);
- `train.batch_warmup_*`: the ramp's batches (`batch_warmup_problems`);
- `train.anneal_from`: the checkpoint it names, read only when `check_files` is on (`anneal_problems`);
- the files the config points at: shard indexes, the tokenizer, `model.init_from` (`data_problems`),
  only when `check_files` is on, so a config can be checked where its data does not exist.

Each problem names its keys and the fix; the loader raises them all in one ConfigError. The domain
modules (phases.py, schedules.py, batch_plan.py, anneal.py, deepspeed_section.py) keep the arithmetic
these rules share with training; this module imports them, never the reverse.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from pipeline.common import size_limits as lim
from pipeline.common.errors import PipelineError
from pipeline.pretrain import checkpoints
from pipeline.pretrain.anneal import source_checkpoint
from pipeline.pretrain.batch_plan import batch_problem, ramp_problems
from pipeline.pretrain.config import (
    MODERNBERT_DEFAULTS,
    DataConfig,
    MaskingConfig,
    ModelConfig,
    PretrainConfig,
    ScheduleConfig,
    corpus_shares,
)
from pipeline.pretrain.deepspeed_section import deepspeed_key_problems, owned_key_problems
from pipeline.pretrain.phases import phase_ends
from pipeline.pretrain.schedules import DECAYS, WSD_DECAYS, wsd_decay_steps


def pretrain_problems(config: PretrainConfig, *, world_size: int, cuda: bool, check_files: bool) -> list[str]:
    """Every problem of `config`: its cross-field rules, then the checks that need phases, compile or files."""
    problems = []
    if config.phases:
        problems += phase_problems(config, world_size)
    problems += config_problems(config, world_size=world_size, cuda=cuda)
    problems += schedule_problems(config.schedule, config.train.max_steps)
    if config.train.compile:
        problems += compile_problems(config, cuda=cuda)
    problems += batch_warmup_problems(config, world_size)
    problems += anneal_problems(config, check_files=check_files)
    if config.model.attn_implementation == "flex_attention":
        if cuda:  # transformers runs FlexAttention through torch.compile: Triton on GPU
            flex = inductor_problem("model.attn_implementation flex_attention", "model.attn_implementation=sdpa",
                                    cuda=cuda)
            problems += [flex] if flex else []
        else:  # torch 2.13 raises NotImplementedError at the first backward
            problems.append("model.attn_implementation flex_attention: FlexAttention has no backward on CPU, so it "
                            "cannot train there; use sdpa on CPU (packed documents work with it too)")
    if check_files and (config.data.shards or config.phases) and config.data.tokenizer:
        problems += data_problems(config)
    return problems


def config_problems(config: PretrainConfig, *, world_size: int, cuda: bool) -> list[str]:
    """Every cross-field problem of `config` as written, each naming its keys.

    `pretrain_problems` runs these with the checks of phases, `train.compile` and the files the config points at.
    """
    c = config
    problems: list[str] = []
    add = problems.append
    if not c.phases and not c.data.shards:
        add("data.shards: required (the folder written by data_prep/shard.py, or a list of {path, weight})")
    elif not c.phases and c.data.mixed:
        problems += mix_problems(c.data, c.train.global_batch_size)
    if not c.data.tokenizer:
        add("data.tokenizer: required (the tokenizer folder or hub name the shards were made with)")
    if c.data.num_workers < 0:
        add(f"data.num_workers: must be ≥ 0, got {c.data.num_workers}")
    m = c.model
    for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size"):
        if getattr(m, name) < 1:
            add(f"model.{name}: must be ≥ 1, got {getattr(m, name)}")
    if m.num_attention_heads >= 1 and m.hidden_size % m.num_attention_heads:
        add(f"model.hidden_size {m.hidden_size} is not divisible by model.num_attention_heads {m.num_attention_heads}")
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        if not 0 <= getattr(m, name) < 1:
            add(f"model.{name}: must be in [0, 1), got {getattr(m, name)}")
    if m.architecture == "bert" and m.type_vocab_size is not None and m.type_vocab_size < 2:
        add(f"model.type_vocab_size: BERT's next-sentence task needs 2 segments, got {m.type_vocab_size}")
    if m.architecture != "bert" and not m.next_sentence_loss:
        add(f"model.next_sentence_loss: false applies to model.architecture bert only ({m.architecture} has no "
            "next-sentence head); leave it out")
    if m.attn_implementation == "flex_attention" and m.attention_probs_dropout_prob:
        # transformers' flex path raises at the first training step: FlexAttention has no attention dropout.
        add(f"model.attention_probs_dropout_prob: flex_attention has no attention dropout, got "
            f"{m.attention_probs_dropout_prob}; set it to 0 (ModernBERT's own default) or use another "
            "model.attn_implementation")
    problems += modernbert_problems(m)
    k = c.masking
    if not 0 < k.probability < 1:
        add(f"masking.probability: must be in (0, 1), got {k.probability}")
    if k.eval_probability is not None and not 0 < k.eval_probability < 1:
        add(f"masking.eval_probability: must be in (0, 1) or null (the training rate), got {k.eval_probability}")
    if k.mask_token_fraction < 0 or k.random_token_fraction < 0 or k.mask_token_fraction + k.random_token_fraction > 1:
        add(f"masking.mask_token_fraction {k.mask_token_fraction} + masking.random_token_fraction "
            f"{k.random_token_fraction} must be non-negative and sum to at most 1")
    if k.unit == "span":
        problems += span_problems(k)
    o = c.optimizer
    if o.lr <= 0:
        add(f"optimizer.lr: must be > 0, got {o.lr}")
    if not all(0 <= b < 1 for b in o.betas):
        add(f"optimizer.betas: each must be in [0, 1), got {list(o.betas)}")
    if o.fused and o.name != "adamw":
        add(f"optimizer.fused: only for optimizer.name adamw, got {o.name}")
    if o.decouple_lr and o.name != "stableadamw":
        add(f"optimizer.decouple_lr: only for optimizer.name stableadamw, got {o.name}")
    if o.eps <= 0 or o.weight_decay < 0:
        add(f"optimizer.eps must be > 0 and optimizer.weight_decay ≥ 0, got {o.eps} and {o.weight_decay}")
    s, t = c.schedule, c.train
    if s.warmup_steps < 0 or s.warmup_steps > t.max_steps:
        add(f"schedule.warmup_steps {s.warmup_steps} must be between 0 and train.max_steps {t.max_steps}")
    if not 0 <= s.end_lr_ratio <= 1 or s.power <= 0:
        add(f"schedule.end_lr_ratio must be in [0, 1] and schedule.power > 0, got {s.end_lr_ratio} and {s.power}")
    if t.max_steps < 1:
        add(f"train.max_steps: must be ≥ 1, got {t.max_steps}")
    problem = None if c.phases else batch_problem(t.global_batch_size, t.micro_batch_size, world_size)
    if problem:  # with phases, each phase's batch is checked in phase_problems
        add(problem)
    if t.gradient_clipping < 0:
        add(f"train.gradient_clipping: must be ≥ 0 (0 turns it off), got {t.gradient_clipping}")
    for name in ("log_every", "eval_sequences"):
        if getattr(t, name) < 1:
            add(f"train.{name}: must be ≥ 1, got {getattr(t, name)}")
    if t.eval_every < 0:
        add(f"train.eval_every: must be ≥ 0, got {t.eval_every}")
    if not t.collective_timeout_s > 0:
        add(f"train.collective_timeout_s: must be > 0 seconds, got {t.collective_timeout_s}")
    if t.peak_tflops is not None and t.peak_tflops <= 0:
        add(f"train.peak_tflops: must be > 0 or null, got {t.peak_tflops}")
    if c.checkpoint.every < 1 or c.checkpoint.keep_last < 1:
        add(f"checkpoint.every and checkpoint.keep_last must be ≥ 1, got {c.checkpoint.every} and "
            f"{c.checkpoint.keep_last}")
    if not c.tracking.experiment:
        add("tracking.experiment: must not be empty")
    problems += deepspeed_problems(c, cuda=cuda)
    problems += size_problems(c)
    return problems


def modernbert_problems(m: ModelConfig) -> list[str]:
    """ModernBERT's own keys: in range for modernbert, left at their defaults (unused) for the other architectures."""
    if m.architecture != "modernbert":
        return [f"model.{key}: applies to model.architecture modernbert only ({m.architecture} has no such "
                "setting); leave it out" for key, default in MODERNBERT_DEFAULTS.items() if getattr(m, key) != default]
    problems = []
    if m.local_attention < 2 or m.local_attention % 2:
        problems.append(f"model.local_attention: the window must be an even number ≥ 2 of tokens (half on each "
                        f"side), got {m.local_attention}")
    if m.global_attn_every_n_layers < 1:
        problems.append(f"model.global_attn_every_n_layers: must be ≥ 1 (1: every layer global), got "
                        f"{m.global_attn_every_n_layers}")
    for key in ("global_rope_theta", "local_rope_theta"):
        if getattr(m, key) <= 1:
            problems.append(f"model.{key}: a rotary base must be > 1, got {getattr(m, key)}")
    if m.type_vocab_size is not None:
        problems.append("model.type_vocab_size: modernbert has no segment embeddings; leave it out")
    if m.num_attention_heads >= 1 and m.hidden_size % m.num_attention_heads == 0 \
            and (m.hidden_size // m.num_attention_heads) % 2:
        problems.append(f"model.hidden_size / model.num_attention_heads = {m.hidden_size // m.num_attention_heads}: "
                        "rotary positions need an even head size")
    return problems


def size_problems(c: PretrainConfig) -> list[str]:
    """Values that would allocate absurd memory (a typo's seq_len 10^9), against pipeline/common/size_limits.py."""
    m, t = c.model, c.train
    checks = [(f"model.{name}", getattr(m, name), lim.MAX_MODEL_WIDTH) for name in ("hidden_size", "intermediate_size")]
    checks += [(f"model.{name}", getattr(m, name), lim.MAX_LAYERS) for name in ("num_hidden_layers",
                                                                               "num_attention_heads")]
    checks += [("model.type_vocab_size", m.type_vocab_size, lim.MAX_VOCAB),
               ("train.global_batch_size", t.global_batch_size, lim.MAX_GLOBAL_BATCH),
               ("train.micro_batch_size", t.micro_batch_size, lim.MAX_MICRO_BATCH),
               ("train.eval_sequences", t.eval_sequences, lim.MAX_GLOBAL_BATCH)]
    for i, p in enumerate(c.phases or ()):
        checks += [(f"phases[{i}].seq_len", p.seq_len, lim.MAX_SEQ_LEN),
                   (f"phases[{i}].global_batch_size", p.global_batch_size, lim.MAX_GLOBAL_BATCH),
                   (f"phases[{i}].micro_batch_size", p.micro_batch_size, lim.MAX_MICRO_BATCH)]
    # Below-minimum values are the other checks' to report; only the upper bounds are new here.
    return lim.bound_problems(checks, minimum=-(1 << 62))


def span_problems(k: MaskingConfig) -> list[str]:
    from pipeline.pretrain.masking import MaskingSpec

    if not 0 < k.span_p <= 1 or k.span_max_words < 1:
        return [f"masking.span_p must be in (0, 1] and masking.span_max_words ≥ 1, got {k.span_p} and "
                f"{k.span_max_words}"]
    # Spans are separated by at least one word, so they cover at most mean / (mean + 1) of the words.
    mean = MaskingSpec(1, 0, (), span_p=k.span_p, span_max_words=k.span_max_words).mean_span_words
    most = mean / (mean + 1)
    if 0 < k.probability < 1 and k.probability > most:
        return [f"masking.probability {k.probability} is more than spans of {mean:.2f} words on average "
                f"(masking.span_p {k.span_p}, masking.span_max_words {k.span_max_words}) can cover with a word "
                f"between them ({most:.3f}); lower it or lengthen the spans"]
    return []


def deepspeed_problems(config: PretrainConfig, *, cuda: bool) -> list[str]:
    """Precision and ZeRO against this machine, and the `deepspeed` section (pipeline/pretrain/deepspeed_section.py)."""
    ds, t = config.deepspeed, config.train
    problems = owned_key_problems(ds)
    if t.precision == "fp16" and not cuda:
        problems.append("train.precision: fp16 needs a GPU (DeepSpeed does not support it on CPU); use bf16 on a CPU "
                        "with native bf16, fp32 elsewhere")
    offload = ds.get("zero_optimization", {}).get("offload_optimizer") if isinstance(
        ds.get("zero_optimization"), dict) else None
    if config.optimizer.name == "lamb" and (offload or {}).get("device", "none") not in ("none", None):
        problems.append("optimizer.name lamb with deepspeed.zero_optimization.offload_optimizer: DeepSpeed has no "
                        "CPU Lamb for offloaded optimizer states; drop the offload or use optimizer.name adamw")
    if config.optimizer.name == "stableadamw" and (offload or {}).get("device", "none") not in ("none", None):
        problems.append("optimizer.name stableadamw with deepspeed.zero_optimization.offload_optimizer: DeepSpeed "
                        "offloads only its own CPU Adam's states; drop the offload or use optimizer.name adamw")
    return problems + deepspeed_key_problems(ds)


# MLflow accepts these in metric keys; '/' is kept out of names because it separates the key's parts.
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def mix_problems(data: DataConfig, global_batch_size: int) -> list[str]:
    """Checks of a weighted list of corpora that need no files: paths, weights, names."""
    problems = []
    add = problems.append
    corpora = data.corpora()
    for i, source in enumerate(corpora):
        key = f"data.shards[{i}]"
        if not source.path:
            add(f"{key}.path: required (a folder written by data_prep/shard.py)")
        if not 0 < source.weight < float("inf"):
            add(f"{key}.weight: must be a positive number, got {source.weight}")
        if not source.name or not set(source.name) <= _NAME_CHARS or not source.name[0].isalnum():
            add(f"{key}.name: {source.name!r} (from the folder's name unless set) must start with a letter or digit "
                f"and hold only letters, digits, '_', '-' and '.', as it becomes part of metric keys; set {key}.name")
    names = [s.name for s in corpora]
    for name in sorted({n for n in names if names.count(n) > 1}):
        add(f"data.shards: {names.count(name)} corpora are named {name!r}; give each a distinct `name`")
    paths = [str(Path(s.path).resolve()) for s in corpora if s.path]
    for path in sorted({p for p in paths if paths.count(p) > 1}):
        add(f"data.shards: {path} is listed {paths.count(path)} times; give it one entry with the summed weight")
    if problems:
        return problems
    for source, share in zip(corpora, corpus_shares([s.weight for s in corpora]), strict=True):
        if share * global_batch_size < 1:  # see mixture.py: each step's quota is then never negative
            add(f"data.shards: {source.name} has weight {source.weight}, a share of {float(share):.3g}: less than "
                f"one of the {global_batch_size} sequences of a global batch; each corpus needs a share ≥ "
                f"1/train.global_batch_size = {1 / global_batch_size:.3g} (raise its weight or the global batch)")
    return problems


def phase_problems(config: PretrainConfig, world_size: int) -> list[str]:
    """Checks of `phases` that need no files: names, fractions and the steps they give, batches, LR, warmup, decay,
    RoPE theta."""

    problems = []
    add = problems.append
    if config.data.shards:
        add("data.shards and phases: with phases each phase names its folder in phases[i].shards; remove "
            "data.shards")
    t = config.train
    names = [p.name for p in config.phases]
    fractions = [p.steps_fraction for p in config.phases]
    for name in sorted({n for n in names if names.count(n) > 1}):
        add(f"phases: {names.count(name)} phases are named {name!r}; give each a distinct name")
    total = sum(Fraction(repr(float(f))) for f in fractions)
    if total != 1:
        add(f"phases[*].steps_fraction: must sum to 1, got {' + '.join(map(str, fractions))} = {float(total):g}")
    ends = phase_ends(fractions, max(t.max_steps, 1))
    for i, (p, start, end) in enumerate(zip(config.phases, [0, *ends], ends, strict=False)):
        key = f"phases[{i}]"
        if not p.name or not set(p.name) <= _NAME_CHARS or not p.name[0].isalnum():
            add(f"{key}.name: {p.name!r} must start with a letter or digit and hold only letters, digits, '_', '-' "
                "and '.' (it becomes an MLflow tag and a checkpoint field)")
        if not p.shards:
            add(f"{key}.shards: required (the folder written by data_prep/shard.py for this phase)")
        if not 0 < p.steps_fraction <= 1:
            add(f"{key}.steps_fraction: must be in (0, 1], got {p.steps_fraction}")
        elif end <= start:
            add(f"{key}.steps_fraction {p.steps_fraction} of train.max_steps {t.max_steps} gives the phase 0 steps "
                f"(steps {start} to {end}); raise its fraction or train.max_steps, or drop the phase")
        if p.seq_len is not None and p.seq_len < 1:
            add(f"{key}.seq_len: must be ≥ 1 or null, got {p.seq_len}")
        if p.lr is not None and p.lr <= 0:
            add(f"{key}.lr: must be > 0 or null, got {p.lr}")
        problem = batch_problem(t.global_batch_size if p.global_batch_size is None else p.global_batch_size,
                                t.micro_batch_size if p.micro_batch_size is None else p.micro_batch_size, world_size,
                                keys=(f"{key}.global_batch_size (or train.global_batch_size)",
                                      f"{key}.micro_batch_size (or train.micro_batch_size)"))
        if problem:
            add(problem)
        warmup, source = ((p.warmup_steps, f"{key}.warmup_steps") if p.warmup_steps is not None
                          else (config.schedule.warmup_steps, f"schedule.warmup_steps (the default of {key})"))
        if not 0 <= warmup <= max(end - start, 0):
            add(f"{source} {warmup} must be between 0 and the phase's {end - start} steps")
        if p.decay_steps is not None and config.schedule.kind != "wsd":
            add(f"{key}.decay_steps: only for schedule.kind wsd (kind {config.schedule.kind} decays over each whole "
                "phase); leave it out")
        elif config.schedule.kind == "wsd" and end > start:
            decay, source = ((p.decay_steps, f"{key}.decay_steps") if p.decay_steps is not None else
                             (wsd_decay_steps(config.schedule, end - start), "the schedule's decay"))
            if not 0 <= decay <= max(end - start - warmup, 0):
                add(f"{source} ({decay} steps) must be between 0 and the {end - start - warmup} steps that {key}'s "
                    "warmup leaves")
        for theta in ("global_rope_theta", "local_rope_theta"):
            value = getattr(p, theta)
            if value is not None and config.model.architecture != "modernbert":
                add(f"{key}.{theta}: applies to model.architecture modernbert only ({config.model.architecture} has "
                    "no rotary positions); leave it out")
            elif value is not None and value <= 1:
                add(f"{key}.{theta}: a rotary base must be > 1, got {value}")
    return problems


def batch_warmup_problems(config: PretrainConfig, world_size: int) -> list[str]:
    """`train.batch_warmup_*`: the ramp's batches (batch_plan.ramp_problems), on one folder, without phases."""
    t = config.train
    problems = ramp_problems(t.global_batch_size, t.batch_warmup_start, t.batch_warmup_tokens, t.micro_batch_size,
                             world_size)
    if t.batch_warmup_tokens > 0 and config.phases:
        problems.append("train.batch_warmup_tokens with phases: give the phases their own global batches "
                        "(phases[i].global_batch_size), or drop the batch warmup")
    if t.batch_warmup_tokens > 0 and config.data.mixed:
        problems.append("train.batch_warmup_tokens with a mix of corpora (data.shards as a list): the warmup "
                        "continues one folder's stream; use one folder")
    return problems


def schedule_problems(schedule: ScheduleConfig, max_steps: int) -> list[str]:
    """The schedule section's own checks, each naming its keys."""
    s, problems = schedule, []
    add = problems.append
    if s.kind == "wsd":
        if s.decay not in WSD_DECAYS:
            add(f"schedule.decay: kind wsd decays as one of {', '.join(WSD_DECAYS)}, got {s.decay!r}")
        if (s.decay_steps is None) == (s.decay_fraction is None):
            add("schedule.decay_steps or schedule.decay_fraction: kind wsd needs exactly one (the decay's length in "
                "steps, or its share of the steps)")
        if s.decay_steps is not None and s.decay_steps < 0:
            add(f"schedule.decay_steps: must be ≥ 0, got {s.decay_steps}")
        if s.decay_fraction is not None and not 0 <= s.decay_fraction <= 1:
            add(f"schedule.decay_fraction: must be in [0, 1], got {s.decay_fraction}")
        elif max_steps >= 1 and s.warmup_steps + wsd_decay_steps(s, max_steps) > max_steps:
            add(f"schedule.warmup_steps {s.warmup_steps} + the decay's {wsd_decay_steps(s, max_steps)} steps exceed "
                f"train.max_steps {max_steps}; shorten one of them")
    else:
        if s.decay == "1-sqrt":
            add("schedule.decay: 1-sqrt is a WSD decay; set schedule.kind wsd (with schedule.decay_steps or "
                "schedule.decay_fraction)")
        for key in ("decay_steps", "decay_fraction"):
            if getattr(s, key) is not None:
                add(f"schedule.{key}: only for schedule.kind wsd (kind {s.kind} decays over all steps after the "
                    "warmup); leave it out")
    return problems


def anneal_problems(config: PretrainConfig, *, check_files: bool) -> list[str]:
    """`train.anneal_from` / `train.anneal_steps` as written and, with `check_files`, the checkpoint they name."""
    t = config.train
    if t.anneal_from is None and t.anneal_steps is None:
        return []
    if not t.anneal_from or t.anneal_steps is None:
        return ["train.anneal_from and train.anneal_steps: give both (the checkpoint to decay from and the decay's "
                "steps; launchers/pretrain.py --anneal-from CKPT --anneal-steps N), or neither"]
    problems = []
    if t.anneal_steps < 1:
        problems.append(f"train.anneal_steps: must be ≥ 1, got {t.anneal_steps}")
    if config.phases:
        problems.append("train.anneal_from with phases: annealing runs one decay on one data stream; give the "
                        "config of the phase to anneal (its shards, batch and LR) without phases")
    if config.schedule.decay not in DECAYS:
        problems.append(f"train.anneal_from with schedule.decay {config.schedule.decay!r}: the anneal is a decay; "
                        f"choose one of {', '.join(DECAYS)}")
    if not check_files:
        return problems
    try:
        checkpoint = source_checkpoint(config)
        marker = checkpoints.read_marker(checkpoint)
    except PipelineError as err:
        return [*problems, f"train.anneal_from: {err}"]
    if checkpoint.resolve().is_relative_to(config.layout.checkpoints.resolve()):
        problems.append(f"train.anneal_from {checkpoint} is inside this run's own train.output_dir; the anneal "
                        "writes into its own folder: give it another train.output_dir")
    saved = marker.get("batch_plan", {}).get("global_batch_size")
    if saved != t.global_batch_size and not t.batch_warmup_tokens:  # with one, the checkpointer checks its step's
        problems.append(f"train.anneal_from {checkpoint} was trained with global batch {saved}, "
                        f"train.global_batch_size is {t.global_batch_size}; the data stream continues only at the "
                        f"same global batch: set train.global_batch_size={saved}")
    return problems


def compile_problems(config: PretrainConfig, *, cuda: bool) -> list[str]:
    """Why `train.compile` cannot work here (no compiler for inductor, an untested ZeRO stage); empty if it can."""
    problems = []
    if config.zero_stage == 3:
        # ZeRO-3 gathers each parameter in forward hooks; plain torch.compile does not trace those
        # (DeepSpeed's own answer is DeepCompile), and this pipeline has not tested the pairing.
        problems.append("train.compile with train.zero_stage 3: not supported by this pipeline "
                        "(ZeRO-3 gathers parameters in hooks that torch.compile does not trace); use stage 0-2 "
                        "or train.compile=false")
    problem = inductor_problem("train.compile", "train.compile=false", cuda=cuda)
    if problem:
        problems.append(problem)
    return problems


def inductor_problem(key: str, fix: str, *, cuda: bool) -> str | None:
    """Why inductor cannot compile here (no Triton on GPU, no C++ compiler on CPU) as a problem of `key`, or None.

    `train.compile` needs it, and so does `model.attn_implementation: flex_attention`, which transformers
    runs through torch.compile'd FlexAttention.
    """
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
