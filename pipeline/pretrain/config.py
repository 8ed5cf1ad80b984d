"""The pretraining config: one dataclass per section, each checking its own fields in `__post_init__`.

Every problem names the key the user typed; `PretrainConfig.__post_init__` holds the rules between
sections, and `config_tree.build_config` returns them all in one ConfigError. What needs the run's
arithmetic, this machine or files is the preflight's (preflight.py); nothing here imports it back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, get_args

from pipeline.common.config import size_limits as lim
from pipeline.common.config.tree import refuse, too_small
from pipeline.common.processes.lost_rank import DEFAULT_COLLECTIVE_TIMEOUT_S
from pipeline.common.run_layout import PretrainLayout
from pipeline.models.architectures.config import ModelConfig
from pipeline.models.architectures.span_contrast import SpanContrast
from pipeline.models.precision import Precision
from pipeline.pretrain.deepspeed_keys import (
    communication_problems,
    deepspeed_key_problems,
    grad_scaler_problems,
    offloads_optimizer,
    owned_key_problems,
)
from pipeline.pretrain.span_lengths import span_coverage_problem
from pipeline.tracking.metrics import file_metric_name
from pipeline.tracking.settings import TrackingConfig

ZeroStage = Literal[0, 1, 2, 3]
Decay = Literal["linear", "polynomial", "cosine", "constant", "1-sqrt"]
SpikeGuardMode = Literal["off", "skip", "rollback"]

WSD_DECAYS = ("linear", "cosine", "1-sqrt")
"""The decays `schedule.kind: wsd` offers (pipeline/pretrain/plan/schedules.py computes them)."""



def name_problems(key: str, name: str | None, why: str) -> list[str]:
    """`key`'s `name` if it cannot be part of a metric key or tag (a character MLflow refuses, or '/', which
    separates a key's parts)."""
    if name and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        return []
    return [f"{key}: {name!r} must start with a letter or digit and hold only letters, digits, '_', '-' and '.' "
            f"({why})"]


@dataclass
class CorpusSource:
    """One corpus of a weighted mix: `{"path": "shards/wiki", "weight": 0.3}` (Megatron's data blend)."""

    path: str = ""
    """A folder written by data_prep/shard.py."""
    weight: float = 1.0
    """Relative share of the training sequences drawn from this corpus (the weights are normalised to sum 1)."""
    name: str | None = None
    """The corpus's name in metric keys such as `eval/<name>/mlm_loss`; None: the folder's name."""


@dataclass
class DataConfig:
    shards: str | list[CorpusSource] = ""
    """The folder written by data_prep/shard.py, or a weighted mix of such folders: a list of {path, weight}."""
    tokenizer: str = ""
    """The tokenizer the shards were made with: a folder or a hub name."""
    num_workers: int = 2
    """DataLoader worker processes per rank (0: load in the training process)."""
    cache_dir: str | None = None
    """Where the decompressed token cache lives; None: `<train.output_dir>/token_cache`."""
    mix_temperature: float | None = None
    """A mix's shares from the corpora's sizes instead of weights: p_c ∝ N_c^τ over their training sequences
    (XLM-R's and mmBERT's language sampling; 1 keeps the sizes' own shares, lower values flatten them)."""

    def __post_init__(self):
        problems = too_small("data", self, 0, "num_workers")
        if not self.tokenizer:
            problems.append("data.tokenizer: required (the tokenizer folder or hub name the shards were made with)")
        problems += mix_problems("data", self.shards, self.mix_temperature)
        refuse(self, problems)

    @property
    def mixed(self) -> bool:
        """True when `shards` is a list of weighted corpora (even a list of one)."""
        return isinstance(self.shards, list)

    def corpora(self) -> list[CorpusSource]:
        """Every corpus with its name filled in; a single folder is one corpus of weight 1."""
        return named_corpora(self.shards)


def named_corpora(shards: str | list[CorpusSource]) -> list[CorpusSource]:
    """A folder or a mix as corpora with their names filled in; a single folder is one corpus of weight 1."""
    sources = shards if isinstance(shards, list) else [CorpusSource(path=shards)]
    return [CorpusSource(s.path, s.weight, s.name or Path(s.path).name) for s in sources]


def mix_problems(key: str, shards: str | list[CorpusSource], temperature: float | None) -> list[str]:
    """`<key>.shards` as a weighted list of corpora: paths, weights or a temperature, names; their shares of a
    batch need the corpora's sizes (the plan checks them)."""
    problems = []
    add = problems.append
    if temperature is not None and not 0 < temperature < float("inf"):
        add(f"{key}.mix_temperature: must be a positive number, got {temperature}")
    if not isinstance(shards, list):
        if temperature is not None:
            add(f"{key}.mix_temperature: applies to a mix of corpora ({key}.shards as a list); leave it out")
        return problems
    corpora = named_corpora(shards)
    for i, source in enumerate(corpora):
        item = f"{key}.shards[{i}]"
        if not source.path:
            add(f"{item}.path: required (a folder written by data_prep/shard.py)")
        if not 0 < source.weight < float("inf"):
            add(f"{item}.weight: must be a positive number, got {source.weight}")
        elif temperature is not None and source.weight != 1.0:
            add(f"{item}.weight: {key}.mix_temperature sets the shares from the corpora's sizes; give weights or a "
                "temperature, not both")
        problems += name_problems(f"{item}.name", source.name, "it becomes part of metric keys; it is the "
                                  f"folder's name unless {item}.name is set")
    names = [s.name for s in corpora]
    for name in sorted({n for n in names if names.count(n) > 1}):
        add(f"{key}.shards: {names.count(name)} corpora are named {name!r}; give each a distinct `name`")
    paths = [str(Path(s.path).resolve()) for s in corpora if s.path]
    for path in sorted({p for p in paths if paths.count(p) > 1}):
        add(f"{key}.shards: {path} is listed {paths.count(path)} times; give it one entry with the summed weight")
    return problems


@dataclass
class MaskingConfig:
    """MLM masking: what is chosen, at which rate, and how it is corrupted (plan/masking.py's `Masker`)."""

    mode: Literal["dynamic", "static"] = "dynamic"
    probability: float = 0.15
    """Fraction of tokens (unit token), of words (unit word) or of words covered by spans (unit span)."""
    eval_probability: float | None = None
    """The same fraction for validation (None: `probability`). ModernBERT trains at 0.3 and reports at 0.15, so
    losses compare across recipes; every validation loss is logged beside its rate (`eval/mask_rate`)."""
    mask_token_fraction: float = 0.8
    random_token_fraction: float = 0.1
    unit: Literal["token", "word", "span"] = "token"
    """What is chosen: single tokens, whole words (all sub-tokens), or SpanBERT spans of whole words."""
    span_p: float = 0.2
    """unit span: span lengths in words are geometric with this p (SpanBERT: 0.2, mean 3.8 words)."""
    span_max_words: int = 10
    """unit span: the longest span, in words; the geometric distribution is truncated here and renormalised."""

    def __post_init__(self):
        problems = self.rate_problems("masking.probability", self.probability, "")
        problems += self.rate_problems("masking.eval_probability", self.eval_probability,
                                       " or null (the training rate)")
        if min(self.mask_token_fraction, self.random_token_fraction) < 0 \
                or self.mask_token_fraction + self.random_token_fraction > 1:
            problems.append(f"masking.mask_token_fraction {self.mask_token_fraction} + masking.random_token_fraction "
                            f"{self.random_token_fraction} must be non-negative and sum to at most 1")
        if self.unit == "span" and not self._spans_valid:
            problems.append(f"masking.span_p must be in (0, 1] and masking.span_max_words ≥ 1, got {self.span_p} and "
                            f"{self.span_max_words}")
        refuse(self, problems)

    @property
    def _spans_valid(self) -> bool:
        return 0 < self.span_p <= 1 and self.span_max_words >= 1

    def rate_problems(self, key: str, rate: float | None, null: str) -> list[str]:
        """Why a masker of this section cannot mask at `rate`, the value of `key` (`null` says what None means): a
        rate outside (0, 1), or one its spans cannot cover (the Masker relies on both)."""
        if rate is None:
            return []
        if not 0 < rate < 1:
            return [f"{key}: must be in (0, 1){null}, got {rate}"]
        problem = self.unit == "span" and self._spans_valid and span_coverage_problem(key, rate, self.span_p,
                                                                                       self.span_max_words)
        return [problem] if problem else []


@dataclass
class ContrastiveConfig:
    """A span-contrastive term added to the MLM loss (coCondenser's span loss, Contriever's crops): two random spans
    of each document, mean-pooled from the MLM forward's last hidden states, in a symmetric in-batch InfoNCE
    (batches/span_sampler.py draws them, models/architectures/span_contrast.py scores them). Off at weight 0."""

    weight: float = 0.0
    """λ, unitless: the training loss is MLM + λ · span loss (0: off, no spans drawn)."""
    temperature: float = 0.05
    """Unitless: the InfoNCE logits are the spans' cosine similarities divided by this."""
    min_tokens: int = 8
    """Tokens: the shortest span."""
    max_tokens: int = 64
    """Tokens: the longest span."""
    min_fraction: float = 0.1
    """Share of the document's tokens: the shortest span (rounded up; `min_tokens` when that is more)."""
    max_fraction: float = 0.5
    """Share of the document's tokens: the longest span (rounded down; `max_tokens` when that is less)."""
    min_document_tokens: int = 16
    """Tokens: shorter documents hold no spans (nor do those whose span bounds cross: min > max)."""
    documents_per_row: int = 1
    """Documents per row of a micro batch, the static count of its document slots (rows × this), filled at random
    from its eligible documents: doc-packed rows hold several; full and doc rows one each."""

    def __post_init__(self):
        problems = too_small("contrastive", self, 1, "min_tokens", "min_document_tokens", "documents_per_row")
        add = problems.append
        if not 0 <= self.weight < float("inf"):
            add(f"contrastive.weight: must be a finite number ≥ 0 (0 turns the term off), got {self.weight}")
        if not 0 < self.temperature < float("inf"):
            add(f"contrastive.temperature: must be a positive number, got {self.temperature}")
        if self.max_tokens < self.min_tokens:
            add(f"contrastive.max_tokens: must be ≥ contrastive.min_tokens {self.min_tokens}, got {self.max_tokens}")
        if not 0 < self.min_fraction <= self.max_fraction <= 1:
            add(f"contrastive.min_fraction and contrastive.max_fraction: need 0 < min ≤ max ≤ 1, got "
                f"{self.min_fraction} and {self.max_fraction}")
        refuse(self, problems)

    @property
    def on(self) -> bool:
        return self.weight > 0

    @property
    def model_term(self) -> SpanContrast | None:
        """What the training model needs of this section (its loss's weight and temperature); None when off."""
        return SpanContrast(self.weight, self.temperature, self.documents_per_row) if self.on else None


@dataclass
class OptimizerConfig:
    name: Literal["adamw", "lamb", "stableadamw"] = "adamw"
    """adamw (torch's fused); lamb (You et al. 2019) for very large batches; or stableadamw (Wortsman et al. 2023;
    ModernBERT): AdamW whose step size is divided by each tensor's update RMS when it exceeds 1 (step/optimizers.py
    has both)."""
    lr: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    weight_decay: float = 0.01
    fused: bool | None = None
    """adamw: torch's fused AdamW kernel (true), or its unfused one (false); null: fused, except under DeepSpeed's
    own fp16 at ZeRO 1-3 (engine.py says why). Only the fused kernel skips an fp16 overflow step at ZeRO 0 on the
    device (unfused, the loss scaler reads the host each step)."""
    decouple_lr: bool = False
    """stableadamw: fully decoupled weight decay, each step shrinking weights by weight_decay × LR / optimizer.lr
    (ModernBERT's `decoupled_stableadamw`, weight_decay 1e-5) instead of AdamW's weight_decay × LR."""

    def __post_init__(self):
        problems = []
        add = problems.append
        if self.lr <= 0:
            add(f"optimizer.lr: must be > 0, got {self.lr}")
        if not all(0 <= b < 1 for b in self.betas):
            add(f"optimizer.betas: each must be in [0, 1), got {list(self.betas)}")
        if self.fused and self.name != "adamw":  # false: what other optimizers are anyway
            add(f"optimizer.fused: only for optimizer.name adamw, got {self.name}")
        if self.decouple_lr and self.name != "stableadamw":
            add(f"optimizer.decouple_lr: only for optimizer.name stableadamw, got {self.name}")
        if self.eps <= 0 or self.weight_decay < 0:
            add(f"optimizer.eps must be > 0 and optimizer.weight_decay ≥ 0, got {self.eps} and {self.weight_decay}")
        refuse(self, problems)


@dataclass
class ScheduleConfig:
    """Linear warmup, then a decay over the remaining steps or warmup–stable–decay (plan/schedules.py)."""

    kind: Literal["warmup-decay", "wsd"] = "warmup-decay"
    """warmup-decay: decay over every step after the warmup; wsd: hold the peak, decay over the last steps only."""
    warmup_steps: int = 0
    decay: Decay = "linear"
    """The decay's shape: linear, polynomial, cosine or constant (warmup-decay); linear, cosine or 1-sqrt (wsd)."""
    power: float = 1.0
    """Exponent of the polynomial decay (1.0 is linear)."""
    end_lr_ratio: float = 0.0
    """LR at `train.max_steps` as a fraction of the peak."""
    decay_steps: int | None = None
    """wsd: the decay's length in optimizer steps (per phase with phases); the stable part is what the warmup leaves."""
    decay_fraction: float | None = None
    """wsd: the decay's length as a share of train.max_steps (of each phase's steps), rounded down; or decay_steps."""

    def __post_init__(self):
        problems = []
        add = problems.append
        if not 0 <= self.end_lr_ratio <= 1 or self.power <= 0:
            add(f"schedule.end_lr_ratio must be in [0, 1] and schedule.power > 0, got {self.end_lr_ratio} and "
                f"{self.power}")
        if self.kind == "wsd":
            if self.decay not in WSD_DECAYS:
                add(f"schedule.decay: kind wsd decays as one of {', '.join(WSD_DECAYS)}, got {self.decay!r}")
            if (self.decay_steps is None) == (self.decay_fraction is None):
                add("schedule.decay_steps or schedule.decay_fraction: kind wsd needs exactly one (the decay's length "
                    "in steps, or its share of the steps)")
            problems += too_small("schedule", self, 0, "decay_steps")
            if self.decay_fraction is not None and not 0 <= self.decay_fraction <= 1:
                add(f"schedule.decay_fraction: must be in [0, 1], got {self.decay_fraction}")
        else:
            if self.decay == "1-sqrt":
                add("schedule.decay: 1-sqrt is a WSD decay; set schedule.kind wsd (with schedule.decay_steps or "
                    "schedule.decay_fraction)")
            for key in ("decay_steps", "decay_fraction"):
                if getattr(self, key) is not None:
                    add(f"schedule.{key}: only for schedule.kind wsd (kind {self.kind} decays over all steps after "
                        "the warmup); leave it out")
        refuse(self, problems)


@dataclass
class TrainConfig:
    output_dir: str = "runs/pretrain"
    max_steps: int = 1000
    global_batch_size: int = 256
    micro_batch_size: int = 16
    seed: int = 0
    gradient_clipping: float = 1.0
    log_every: int = 1
    eval_every: int = 0
    """Evaluate every N optimizer steps (0: only at the end)."""
    eval_sequences: int = 256
    """Validation sequences per evaluation, the same ones with the same masks every time."""
    peak_tflops: float | None = None
    """Peak TFLOP/s of one device in the run's precision, for the MFU estimate (None: no MFU)."""
    export: bool = True
    """Export an HF model folder to `<output_dir>/export` at the end."""
    compile: bool | Literal["auto"] = "auto"
    """torch.compile each transformer block (inductor; compile_blocks.py): a one-off compile at the first steps,
    then faster steps; needs a C++ compiler on CPU and Triton on GPU. auto: on a GPU (not under ZeRO-3), off on
    CPU, where the compile costs more than a short run saves; false turns it off everywhere."""
    batch_warmup_tokens: int = 0
    """Tokens (sequences × seq_len) over which the global batch rises from `batch_warmup_start` to
    `global_batch_size`, linearly, in multiples of the start (0: the full batch from the first step)."""
    batch_warmup_start: int | None = None
    """The first global batch of a batch warmup: a multiple of micro_batch_size × world size that divides
    global_batch_size (None: micro_batch_size; write it down to resume on another number of ranks)."""
    anneal_from: str | None = None
    """A stable-phase checkpoint (`RUN/checkpoints/step_N`, or a run folder: its newest) to run only the decay
    from: its weights, optimizer and data position, into this run's own `output_dir` (see anneal.py)."""
    anneal_steps: int | None = None
    """Steps of the decay after `anneal_from`'s step, from the schedule's LR there to its floor."""
    skip_steps: list[str] = field(default_factory=list)
    """Step ranges "A:B" (1-based and inclusive, as the logs number steps) whose batches are left out: the run
    resumes from its last checkpoint before A, and the step count, LR and later batches go on as if A…B had
    trained (`--skip-steps`; docs/long-runs.md). The run's ledger keeps them for every later resume."""
    restart_from_scratch: bool = False
    """Let a skipped range that no kept checkpoint precedes restart the run from step 0 (every checkpoint set
    aside); without it such a skip is refused before any work (`--restart-from-scratch`)."""
    spike_guard: SpikeGuardMode = "off"
    """Judge each step's loss and gradient norm against the last steps' (the `guard` section; docs/long-runs.md):
    off; skip: an outlier step's update is not applied (ZeRO 0); rollback: the same, and `guard.rollback_after`
    outliers, or a non-finite loss, send the run back to its last checkpoint before them, the spike's batches left
    out (spike_response.py)."""
    inject_spike: str | None = None
    """A drill: "STEP:FACTOR" multiplies step STEP's loss, and so its gradients, by FACTOR before the backward (a
    stand-in for a bad batch, to rehearse the guard; gradient clipping cuts it back to the clip norm)."""
    allow_unlocked_folder: bool = False
    """Go on where `output_dir`'s file system cannot lock the run folder across nodes (no locks, NFS `nolock` or
    `local_lock`, Lustre without `flock`; common/folder_lock.py), which is refused without it: nothing then keeps
    a second run from writing the folder beside this one (`--allow-unlocked-folder`)."""
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    """Seconds a rank waits on the others (one collective, or one optimizer step after the first) before it
    decides one is dead or stuck and exits with an error; it must exceed the longest step and rank 0's export."""
    precision: Precision = "fp32"
    """Training precision: `fp32`, `bf16` (CPU with native bf16, or GPU) or `fp16` (GPU only, dynamic loss scaling)."""
    zero_stage: ZeroStage = 0
    """DeepSpeed ZeRO stage: 0 (data parallel), 1 (optimizer states sharded), 2 (+ gradients), 3 (+ parameters)."""

    def __post_init__(self):
        problems = too_small("train", self, 1, "max_steps", "log_every") + too_small("train", self, 0, "eval_every")
        # Below size_limits' bounds; the batches' lower bounds are preflight.py's, which knows the world size.
        problems += lim.bound_problems([("train.eval_sequences", self.eval_sequences, lim.MAX_GLOBAL_BATCH)])
        problems += lim.bound_problems([("train.global_batch_size", self.global_batch_size, lim.MAX_GLOBAL_BATCH),
                                        ("train.micro_batch_size", self.micro_batch_size, lim.MAX_MICRO_BATCH)],
                                       minimum=None)
        add = problems.append
        if self.gradient_clipping < 0:
            add(f"train.gradient_clipping: must be ≥ 0 (0 turns it off), got {self.gradient_clipping}")
        if not self.collective_timeout_s > 0:
            add(f"train.collective_timeout_s: must be > 0 seconds, got {self.collective_timeout_s}")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            add(f"train.peak_tflops: must be > 0 or null, got {self.peak_tflops}")
        if self.compile is True and self.zero_stage == 3:
            # ZeRO-3 gathers each parameter in forward hooks; plain torch.compile does not trace those
            # (DeepSpeed's own answer is DeepCompile), and this pipeline has not tested the pairing.
            add("train.compile with train.zero_stage 3: not supported by this pipeline (ZeRO-3 gathers parameters "
                "in hooks that torch.compile does not trace); use stage 0-2 or train.compile=false")
        if (self.anneal_from is None) != (self.anneal_steps is None) or self.anneal_from == "":
            add("train.anneal_from and train.anneal_steps: give both (the checkpoint to decay from and the decay's "
                "steps; launchers/pretrain.py --anneal-from CKPT --anneal-steps N), or neither")
        else:
            problems += too_small("train", self, 1, "anneal_steps")
        if self.inject_spike is not None and spike_drill(self.inject_spike) is None:
            add(f"train.inject_spike: {self.inject_spike!r} is not STEP:FACTOR with STEP ≥ 1 and a factor other than "
                "0 (e.g. 300:1e4, the step as the logs number it)")
        refuse(self, problems + self._skip_problems())

    def _skip_problems(self) -> list[str]:
        for text in self.skip_steps:
            match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(text))
            if not match or not 1 <= int(match[1]) <= int(match[2]):
                return [f"train.skip_steps: {text!r} is not a range A:B of steps with 1 ≤ A ≤ B (e.g. 1201:1250, "
                        "the steps as the logs number them)"]
        ranges = self.skipped()
        return [f"train.skip_steps: {a.start + 1}:{a.stop} and {b.start + 1}:{b.stop} overlap; give them as one range"
                for a, b in zip(ranges, ranges[1:], strict=False) if b.start < a.stop]

    def skipped(self) -> tuple[range, ...]:
        """`skip_steps` as ranges of 0-based step indices (the loop's `step` before the step runs), in order."""
        ends = sorted(tuple(int(x) for x in text.split(":")) for text in self.skip_steps)
        return tuple(range(a - 1, b) for a, b in ends)


def spike_drill(text: str) -> tuple[int, float] | None:
    """`train.inject_spike`'s "STEP:FACTOR" as (step, factor); None if it is not one."""
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\S+)\s*", str(text))
    try:
        step, factor = int(match[1]), float(match[2])
    except (TypeError, ValueError):
        return None
    return (step, factor) if step >= 1 and factor != 0 else None


@dataclass
class GuardConfig:
    """How the spike guard (`train.spike_guard`) judges a step, and how far a rollback goes."""

    window: int = 100
    """Steps whose loss and gradient norm make the rolling mean and deviation a step is judged against."""
    threshold: float = 6.0
    """An outlier's loss or gradient norm lies more than this many deviations above the window's mean."""
    min_steps: int = 50
    """Steps the window must hold before the guard judges (a non-finite loss or norm counts from the first)."""
    rollback_after: int = 2
    """rollback: outliers among the last `window` steps that send the run back (a non-finite one always does); each
    before it has its update left out, so the default 2 lets a single false alarm cost one update, not a rollback
    (at ZeRO 1-3, which cannot leave an update out, the first outlier sends the run back)."""
    margin: int = 0
    """rollback: steps before the first outlier (down to the checkpoint) and after the last whose batches are left out
    with them; PaLM left out 200-500 batches around each spike."""
    max_rollbacks: int = 3
    """rollback: the most rollbacks for one spike (the ledger's, across resumes: a rollback belongs to the previous
    one's spike when its outliers come within `window` steps of the range that one left out); one more and the run
    stops, naming the steps. A clean window re-arms it."""

    def __post_init__(self):
        problems = too_small("guard", self, 2, "window", "min_steps") + too_small("guard", self, 1, "rollback_after")
        problems += too_small("guard", self, 0, "margin", "max_rollbacks")
        if not 0 < self.threshold < float("inf"):
            problems.append(f"guard.threshold: must be a positive number of deviations, got {self.threshold}")
        for key in ("min_steps", "rollback_after"):
            if getattr(self, key) > self.window:
                problems.append(f"guard.{key}: must be ≤ guard.window {self.window}, got {getattr(self, key)}")
        refuse(self, problems)


@dataclass
class CheckpointConfig:
    every: int = 1000
    keep_last: int = 2
    keep_set_aside: int = 2
    """Set-aside checkpoints (`rolled-back-step_…`, `damaged-step_…`) kept for a look; past this many the ones set
    aside first are deleted (0: none kept)."""
    resume: Literal["auto", "never"] = "auto"
    """auto: continue from the newest complete checkpoint in `<output_dir>/checkpoints`."""

    def __post_init__(self):
        refuse(self, too_small("checkpoint", self, 1, "every", "keep_last")
               + too_small("checkpoint", self, 0, "keep_set_aside"))


@dataclass
class ProbesConfig:
    """Cheap probes of what the model can do, run at each evaluation beside the validation loss and logged as curves
    (pipeline/hub/quality_probes.py). All off by default; each file's stem names its metrics
    (`probe/retrieval/<stem>/…`)."""

    cloze_texts: int = 0
    """Validation texts of the (first) corpus with 15% of their tokens blanked: top-1 fill accuracy, beside the
    accuracy of always guessing the most frequent blanked token (the plateau's). 0: no cloze probe."""
    minimal_pairs: list[str] = field(default_factory=list)
    """JSONL files of {sentence_good, sentence_bad}: the share of pairs whose good sentence the model scores higher
    (pseudo-log-likelihood: one forward per token, so keep them to a few hundred pairs)."""
    retrieval: list[str] = field(default_factory=list)
    """Pairs files ({query, positive, negative?}): zero-shot nDCG@10, MRR@10 and recall by exact search over every
    positive and negative, with BM25's figures beside."""
    sts: list[str] = field(default_factory=list)
    """Scored pairs files ({sentence1, sentence2, score} with scores in [0, 5]): Spearman's correlation of cosine."""
    pooling: Literal["mean", "cls"] = "mean"
    """How retrieval and STS pool the token vectors into one."""

    def __post_init__(self):
        problems = too_small("probes", self, 0, "cloze_texts")
        for kind in ("minimal_pairs", "retrieval", "sts"):
            stems = [file_metric_name(path) for path in getattr(self, kind)]
            for stem in stems:
                problems += name_problems(f"probes.{kind}", stem, "the file's name before its first '.' names its "
                                                                   "metrics")
            if len(set(stems)) < len(stems):
                problems.append(f"probes.{kind}: two files share a name before their first '.' ({', '.join(stems)}); "
                                f"their metrics would collide")
        refuse(self, problems)

    @property
    def any(self) -> bool:
        return bool(self.cloze_texts or self.minimal_pairs or self.retrieval or self.sts)


@dataclass
class PhaseConfig:
    """One phase of a run in phases (BERT: 90% of the steps at 128 tokens, then 10% at 512); see phases.py."""

    name: str = ""
    """The phase's name: the MLflow tag `phase` while it runs, and `phase` in its checkpoints."""
    steps_fraction: float = 0.0
    """Its share of train.max_steps; the phases' fractions sum to 1 as written (0.9 + 0.1)."""
    shards: str | list[CorpusSource] = ""
    """The folder written by data_prep/shard.py that this phase trains on, or a weighted mix of such folders."""
    mix_temperature: float | None = None
    """The phase's mix shares from the corpora's sizes instead of weights (`data.mix_temperature`)."""
    masking_probability: float | None = None
    """The phase's masking rate (None: masking.probability); mmBERT masks 30%, then 15%, then 5%."""
    seq_len: int | None = None
    """The sequence length its shards must hold, checked against their index.json (None: not checked)."""
    global_batch_size: int | None = None
    """Sequences per optimizer step in this phase (None: train.global_batch_size)."""
    micro_batch_size: int | None = None
    """Sequences per rank per forward pass in this phase (None: train.micro_batch_size)."""
    lr: float | None = None
    """The phase's peak LR (None: optimizer.lr)."""
    warmup_steps: int | None = None
    """Steps from the phase's start to its peak LR (None: schedule.warmup_steps; 0: no re-warmup)."""
    decay_steps: int | None = None
    """schedule.kind wsd: the phase's decay in steps (None: the schedule's; 0: the phase stays at its peak)."""
    global_rope_theta: float | None = None
    """modernbert: the global layers' rotary base from this phase on (None: the previous phase's, else the model's);
    a context-extension phase raises it (ModernBERT: 10k → 160k at 1,024 → 8,192 tokens)."""
    local_rope_theta: float | None = None
    """modernbert: the local layers' rotary base from this phase on (None: the previous phase's, else the model's)."""


@dataclass
class PretrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    contrastive: ContrastiveConfig = field(default_factory=ContrastiveConfig)
    """The span-contrastive term beside the MLM loss (off unless `contrastive.weight` > 0)."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    """The spike guard's window, threshold and rollback bounds (train.spike_guard turns it on)."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    probes: ProbesConfig = field(default_factory=ProbesConfig)
    """What the model can do, probed at each evaluation (off unless a probe is named)."""
    deepspeed: dict[str, Any] = field(default_factory=dict)
    """DeepSpeed's own further keys (deepspeed_keys.py checks them); precision and ZeRO stage are `train`'s."""
    phases: list[PhaseConfig] = field(default_factory=list)
    """Train in phases, each on its own shard folder, batch, LR peak and warmup (empty: one phase, `data.shards`)."""

    def __post_init__(self):
        """The rules between sections; each section's own are in its `__post_init__`."""
        c, t, s = self, self.train, self.schedule
        problems = []
        add = problems.append
        if c.phases:
            problems += self._phase_problems()
        elif not c.data.shards:
            add("data.shards: required (the folder written by data_prep/shard.py, or a list of {path, weight})")
        if s.warmup_steps < 0 or s.warmup_steps > t.max_steps:
            add(f"schedule.warmup_steps {s.warmup_steps} must be between 0 and train.max_steps {t.max_steps}")
        if t.batch_warmup_tokens > 0 and c.phases:
            add("train.batch_warmup_tokens with phases: give the phases their own global batches "
                "(phases[i].global_batch_size), or drop the batch warmup")
        if t.anneal_from and c.phases:
            add("train.anneal_from with phases: annealing runs one decay on one data stream; give the config of the "
                "phase to anneal (its shards, batch and LR) without phases")
        if t.anneal_from and s.decay == "constant":
            decays = [d for d in get_args(Decay) if d != "constant"]
            add(f"train.anneal_from with schedule.decay 'constant': the anneal is a decay; choose one of "
                f"{', '.join(decays)}")
        if c.contrastive.on and c.model.architecture == "bert" and c.model.next_sentence_loss:
            add("contrastive.weight: BERT's next-sentence pair rows join two segments, often of two documents, so a "
                "row is no document to draw spans from; set model.next_sentence_loss false and train on full, doc or "
                "doc-packed shards, or set contrastive.weight 0")
        problems += self._deepspeed_problems() + self._guard_problems()
        refuse(self, problems)

    def _guard_problems(self) -> list[str]:
        """Where the spike guard's remedy can work: a skip inside torch's fused AdamW, a rollback to a kept checkpoint
        from before the first outlier."""
        t, o, c, g = self.train, self.optimizer, self.checkpoint, self.guard
        if t.spike_guard == "skip" and (t.zero_stage != 0 or (o.name == "adamw" and o.fused is False)):
            why = f"train.zero_stage {t.zero_stage}" if t.zero_stage != 0 else "optimizer.fused false"
            return [f"train.spike_guard skip: an outlier's update is left out inside the optimizer's step (its "
                    f"found_inf), which only ZeRO stage 0 hands it, with torch's fused AdamW, LAMB or StableAdamW; "
                    f"got {why}; use train.spike_guard rollback"]
        if t.spike_guard != "rollback":
            return []
        if c.resume == "never":
            return ["train.spike_guard rollback with checkpoint.resume never: a rollback resumes from the run's own "
                    "checkpoints; set checkpoint.resume auto"]
        if (c.keep_last - 1) * c.every < g.window:
            # Found at a logging step, the first outlier may be `window` steps back; the newest checkpoint may be
            # after it, so the one before must still be kept.
            return [f"train.spike_guard rollback: an outlier is found up to guard.window {g.window} steps after it "
                    f"happened, and the rollback needs a checkpoint from before it; checkpoint.keep_last "
                    f"{c.keep_last} at checkpoint.every {c.every} keeps none that old: raise checkpoint.keep_last to "
                    f"{1 + -(-g.window // c.every)}, or lower guard.window"]
        return []

    def _phase_problems(self) -> list[str]:
        """`phases` as written: names, fractions, folders, LR, decay, RoPE bases, sizes (their steps: preflight.py)."""
        problems = []
        add = problems.append
        if self.data.shards:
            add("data.shards and phases: with phases each phase names its folder in phases[i].shards; remove "
                "data.shards")
        names = [p.name for p in self.phases]
        for name in sorted({n for n in names if names.count(n) > 1}):
            add(f"phases: {names.count(name)} phases are named {name!r}; give each a distinct name")
        fractions = [p.steps_fraction for p in self.phases]
        total = sum(Fraction(repr(float(f))) for f in fractions)
        if total != 1:
            add(f"phases[*].steps_fraction: must sum to 1, got {' + '.join(map(str, fractions))} = {float(total):g}")
        modernbert = self.model.architecture == "modernbert"
        for i, p in enumerate(self.phases):
            key = f"phases[{i}]"
            problems += name_problems(f"{key}.name", p.name, "it becomes an MLflow tag and a checkpoint field")
            if not p.shards:
                add(f"{key}.shards: required (the folder written by data_prep/shard.py for this phase, or a mix)")
            problems += mix_problems(key, p.shards, p.mix_temperature)
            problems += self.masking.rate_problems(f"{key}.masking_probability", p.masking_probability,
                                                   " or null (masking.probability)")
            if not 0 < p.steps_fraction <= 1:
                add(f"{key}.steps_fraction: must be in (0, 1], got {p.steps_fraction}")
            if p.lr is not None and p.lr <= 0:
                add(f"{key}.lr: must be > 0 or null, got {p.lr}")
            if p.decay_steps is not None and self.schedule.kind != "wsd":
                add(f"{key}.decay_steps: only for schedule.kind wsd (kind {self.schedule.kind} decays over each "
                    "whole phase); leave it out")
            for theta in ("global_rope_theta", "local_rope_theta"):
                value = getattr(p, theta)
                if value is not None and not modernbert:
                    add(f"{key}.{theta}: applies to model.architecture modernbert only ({self.model.architecture} "
                        "has no rotary positions); leave it out")
                elif value is not None and value <= 1:
                    add(f"{key}.{theta}: a rotary base must be > 1, got {value}")
            problems += lim.bound_problems([(f"{key}.seq_len", p.seq_len, lim.MAX_SEQ_LEN)])
            problems += lim.bound_problems([(f"{key}.global_batch_size", p.global_batch_size, lim.MAX_GLOBAL_BATCH),
                                            (f"{key}.micro_batch_size", p.micro_batch_size, lim.MAX_MICRO_BATCH)],
                                           minimum=None)  # the phase's batch on the world size: preflight.py
        return problems

    def _deepspeed_problems(self) -> list[str]:
        """The `deepspeed` section (deepspeed_keys.py) and the optimizers it cannot offload."""
        ds, name = self.deepspeed, self.optimizer.name
        problems = owned_key_problems(ds)
        why = {"lamb": "DeepSpeed has no CPU Lamb for offloaded optimizer states",
               "stableadamw": "DeepSpeed offloads only its own CPU Adam's states"}
        if name in why and offloads_optimizer(ds):
            problems.append(f"optimizer.name {name} with deepspeed.zero_optimization.offload_optimizer: {why[name]}; "
                            "drop the offload or use optimizer.name adamw")
        problems += grad_scaler_problems(ds, self.train.precision, self.train.zero_stage)
        problems += communication_problems(ds)
        return problems + deepspeed_key_problems(ds)

    @property
    def layout(self) -> PretrainLayout:
        """Every path in the run folder."""
        return PretrainLayout(Path(self.train.output_dir))

    @property
    def cache_dir(self) -> Path:
        return Path(self.data.cache_dir) if self.data.cache_dir else self.layout.token_cache
