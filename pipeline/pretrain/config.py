"""The pretraining config: one dataclass per section, validated as a whole before any process group starts.

`load_pretrain_config(path, overrides, world_size=)` reads JSON, applies `--set` overrides, checks
types and unknown keys (`config_tree`), then every cross-field rule (checks.py, `pretrain_problems`),
and raises one ConfigError listing all problems. The `deepspeed`
section holds only DeepSpeed's own further keys, checked against DeepSpeed's config models
(pipeline/pretrain/deepspeed_section.py); precision and the ZeRO stage are typed keys of `train`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from pipeline.common.lost_rank import DEFAULT_COLLECTIVE_TIMEOUT_S
from pipeline.common.precision import Precision
from pipeline.common.run_kernel import load_config
from pipeline.common.run_layout import PretrainLayout

Architecture = Literal["roberta", "bert", "roberta-prelayernorm", "modernbert"]
ZeroStage = Literal[0, 1, 2, 3]

# ModernBERT's own shape keys and their defaults (ModernBERT-base, Warner et al. 2024); other architectures
# have no such setting and refuse a value other than these.
MODERNBERT_DEFAULTS = {"local_attention": 128, "global_attn_every_n_layers": 3, "global_rope_theta": 160_000.0,
                       "local_rope_theta": 10_000.0, "classifier_pooling": "mean"}


@dataclass
class ModelConfig:
    """The encoder; field names are transformers' own config names (RobertaConfig / BertConfig / ModernBertConfig).

    modernbert maps the shared names onto ModernBertConfig's: `intermediate_size` is the GeGLU width (its
    input projection is twice that), `hidden_act` its `hidden_activation`, `hidden_dropout_prob` its embedding
    and MLP dropout, `attention_probs_dropout_prob` its `attention_dropout`, `layer_norm_eps` its `norm_eps`.
    """

    architecture: Architecture = "roberta"
    init_from: str | None = None
    """Start from these weights (a hub name such as `roberta-base`, or an export folder) instead of random."""
    num_hidden_layers: int = 12
    hidden_size: int = 768
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    type_vocab_size: int | None = None
    """Segment vocabulary: None means 1 for RoBERTa, 2 for BERT."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2", "flex_attention"] = "sdpa"
    """transformers' attention kernel; doc-packed rows work with each (flex_attention: a BlockMask, no flash-attn)."""
    next_sentence_loss: bool = True
    """bert only: add the next-sentence-prediction loss (false: MLM alone on the same pairs data, RoBERTa §4.2)."""
    local_attention: int = 128
    """modernbert only: the sliding window of its local layers, in tokens (each token sees half of it either side)."""
    global_attn_every_n_layers: int = 3
    """modernbert only: every Nth layer (the first, then every N) attends globally, the others locally."""
    global_rope_theta: float = 160_000.0
    """modernbert only: the rotary base of the global layers."""
    local_rope_theta: float = 10_000.0
    """modernbert only: the rotary base of the local (sliding-window) layers."""
    classifier_pooling: Literal["cls", "mean"] = "mean"
    """modernbert only: what a sequence classifier fine-tuned from the export pools, the first token or the mean of
    the real tokens. Saved in the export's config, so fine-tuning and the hub follow it. `mean`: MLM never trains
    the first token's output, and a small, briefly pretrained model's `cls` feature then barely depends on the
    input (docs/benchmarks.md, pretraining gain)."""


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

    @property
    def mixed(self) -> bool:
        """True when `shards` is a list of weighted corpora (even a list of one)."""
        return isinstance(self.shards, list)

    def corpora(self) -> list[CorpusSource]:
        """Every corpus with its name filled in; a single folder is one corpus of weight 1."""
        sources = self.shards if self.mixed else [CorpusSource(path=self.shards)]
        return [CorpusSource(s.path, s.weight, s.name or Path(s.path).name) for s in sources]


@dataclass
class MaskingConfig:
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


@dataclass
class OptimizerConfig:
    name: Literal["adamw", "lamb", "stableadamw"] = "adamw"
    """adamw; lamb (You et al. 2019) for very large batches: DeepSpeed's fused Lamb on GPU, ours on CPU; or
    stableadamw (Wortsman et al. 2023; ModernBERT): AdamW whose step size is divided by each tensor's update RMS
    when it exceeds 1, from torch-optimi."""
    lr: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    weight_decay: float = 0.01
    fused: bool = False
    """adamw: torch's fused AdamW kernel (one pass per parameter, CPU and CUDA) instead of its per-tensor loop."""
    decouple_lr: bool = False
    """stableadamw: fully decoupled weight decay, each step shrinking weights by weight_decay × LR / optimizer.lr
    (ModernBERT's `decoupled_stableadamw`, weight_decay 1e-5) instead of AdamW's weight_decay × LR."""


@dataclass
class ScheduleConfig:
    """Linear warmup, then a decay over the remaining steps or warmup–stable–decay (pipeline/pretrain/schedules.py)."""

    kind: Literal["warmup-decay", "wsd"] = "warmup-decay"
    """warmup-decay: decay over every step after the warmup; wsd: hold the peak, decay over the last steps only."""
    warmup_steps: int = 0
    decay: Literal["linear", "polynomial", "cosine", "constant", "1-sqrt"] = "linear"
    """The decay's shape: linear, polynomial, cosine or constant (warmup-decay); linear, cosine or 1-sqrt (wsd)."""
    power: float = 1.0
    """Exponent of the polynomial decay (1.0 is linear)."""
    end_lr_ratio: float = 0.0
    """LR at `train.max_steps` as a fraction of the peak."""
    decay_steps: int | None = None
    """wsd: the decay's length in optimizer steps (per phase with phases); the stable part is what the warmup leaves."""
    decay_fraction: float | None = None
    """wsd: the decay's length as a share of train.max_steps (of each phase's steps), rounded down; or decay_steps."""


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
    compile: bool = False
    """torch.compile the model through DeepSpeed's `engine.compile()` (inductor): a one-off compile at the
    first steps, then faster steps; needs a C++ compiler on CPU and Triton on GPU."""
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
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    """Seconds a rank waits on the others (one collective, or one optimizer step after the first) before it
    decides one is dead or stuck and exits with an error; it must exceed the longest step and rank 0's export."""
    precision: Precision = "fp32"
    """Training precision: `fp32`, `bf16` (CPU with native bf16, or GPU) or `fp16` (GPU only, dynamic loss scaling)."""
    zero_stage: ZeroStage = 0
    """DeepSpeed ZeRO stage: 0 (data parallel), 1 (optimizer states sharded), 2 (+ gradients), 3 (+ parameters)."""


@dataclass
class CheckpointConfig:
    every: int = 1000
    keep_last: int = 2
    resume: Literal["auto", "never"] = "auto"
    """auto: continue from the newest complete checkpoint in `<output_dir>/checkpoints`."""


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str | None = None
    """MLflow tracking URI; None: $MLFLOW_TRACKING_URI, else `sqlite:///mlflow.db` in the working directory."""
    experiment: str = "pretrain"
    run_name: str | None = None
    flush_seconds: float = 10.0
    """Seconds between waits for MLflow's background logging (also at evals, checkpoints, the end)."""
    registered_model: str | None = None
    """Also register the run's model (the export; each fine-tuning seed's saved model) under this registry name."""


@dataclass
class PhaseConfig:
    """One phase of a run in phases (BERT: 90% of the steps at 128 tokens, then 10% at 512); see phases.py."""

    name: str = ""
    """The phase's name: the MLflow tag `phase` while it runs, and `phase` in its checkpoints."""
    steps_fraction: float = 0.0
    """Its share of train.max_steps; the phases' fractions sum to 1 as written (0.9 + 0.1)."""
    shards: str = ""
    """The folder written by data_prep/shard.py that this phase trains on."""
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
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    deepspeed: dict[str, Any] = field(default_factory=dict)
    phases: list[PhaseConfig] = field(default_factory=list)
    """Train in phases, each on its own shard folder, batch, LR peak and warmup (empty: one phase, `data.shards`)."""

    @property
    def output_dir(self) -> Path:
        return Path(self.train.output_dir)

    @property
    def layout(self) -> PretrainLayout:
        """Every path in the run folder."""
        return PretrainLayout(self.output_dir)

    @property
    def cache_dir(self) -> Path:
        return Path(self.data.cache_dir) if self.data.cache_dir else self.layout.token_cache

    @property
    def precision(self) -> Precision:
        return self.train.precision

    @property
    def zero_stage(self) -> int:
        return self.train.zero_stage


def corpus_shares(weights: list[float]) -> list[Fraction]:
    """The weights normalised to sum exactly 1.

    Each weight is read as the decimal the user wrote (`repr` of the float), not the binary float:
    0.7 is 7/10, so a 0.7:0.3 mix gives exactly 2,688 of 3,840 sequences, not 2,687.
    """
    exact = [Fraction(repr(float(w))) for w in weights]
    total = sum(exact)
    return [w / total for w in exact]


def load_pretrain_config(
    path: str | Path,
    overrides: list[str] = (),
    *,
    world_size: int = 1,
    cuda: bool = False,
    check_files: bool = True,
) -> PretrainConfig:
    """Read, override and validate a pretraining config; all problems come in one ConfigError."""
    # checks.py imports this module's sections, so its rules are imported here, not at the top.
    from pipeline.pretrain.checks import pretrain_problems

    return load_config(PretrainConfig, path, overrides, lambda config, typed: pretrain_problems(
        config, world_size=world_size, cuda=cuda, check_files=check_files and typed))
