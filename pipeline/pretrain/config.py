"""The pretraining config: one dataclass per section, validated as a whole before any process group starts.

`load_pretrain_config(path, overrides, world_size)` reads JSON, applies `--set` overrides, checks
types and unknown keys (`config_tree`), then every cross-field rule below, and raises one
ConfigError listing all problems. The `deepspeed` section is passed to DeepSpeed as given, except
for the keys this pipeline derives (batch sizes, optimizer, scheduler), which it refuses there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.common.errors import PipelineError
from pipeline.common.run_kernel import load_config
from pipeline.common.run_layout import PretrainLayout
from pipeline.pretrain.batch_plan import batch_problem

Architecture = Literal["roberta", "bert"]


@dataclass
class ModelConfig:
    """The encoder; field names are transformers' own config names (RobertaConfig / BertConfig)."""

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
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"


@dataclass
class DataConfig:
    shards: str = ""
    """The folder written by data_prep/shard.py."""
    tokenizer: str = ""
    """The tokenizer the shards were made with: a folder or a hub name."""
    num_workers: int = 2
    """DataLoader worker processes per rank (0: load in the training process)."""
    cache_dir: str | None = None
    """Where the decompressed token cache lives; None: `<train.output_dir>/token_cache`."""


@dataclass
class MaskingConfig:
    mode: Literal["dynamic", "static"] = "dynamic"
    probability: float = 0.15
    mask_token_fraction: float = 0.8
    random_token_fraction: float = 0.1


@dataclass
class OptimizerConfig:
    lr: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    weight_decay: float = 0.01


@dataclass
class ScheduleConfig:
    warmup_steps: int = 0
    decay: Literal["linear", "polynomial", "constant"] = "linear"
    power: float = 1.0
    """Exponent of the polynomial decay (1.0 is linear)."""
    end_lr_ratio: float = 0.0
    """LR at `train.max_steps` as a fraction of the peak."""


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
    def precision(self) -> str:
        for name in ("bf16", "fp16"):
            if self.deepspeed.get(name, {}).get("enabled"):
                return name
        return "fp32"

    @property
    def zero_stage(self) -> int:
        return int(self.deepspeed.get("zero_optimization", {}).get("stage", 0))


# Keys of the deepspeed section that the pipeline derives itself, and where to set them instead.
DERIVED_DEEPSPEED_KEYS = {
    "train_batch_size": "train.global_batch_size",
    "train_micro_batch_size_per_gpu": "train.micro_batch_size",
    "gradient_accumulation_steps": "train.global_batch_size and train.micro_batch_size (it is derived)",
    "optimizer": "the optimizer section",
    "scheduler": "the schedule section",
    "gradient_clipping": "train.gradient_clipping",
}


def load_pretrain_config(
    path: str | Path,
    overrides: list[str] = (),
    *,
    world_size: int = 1,
    cuda: bool = False,
    check_files: bool = True,
) -> PretrainConfig:
    """Read, override and validate a pretraining config; all problems come in one ConfigError."""
    return load_config(PretrainConfig, path, overrides, lambda config, typed: config_problems(
        config, world_size=world_size, cuda=cuda, check_files=check_files and typed))


def config_problems(config: PretrainConfig, *, world_size: int, cuda: bool, check_files: bool) -> list[str]:
    """Every cross-field problem of `config`, each naming its keys."""
    c = config
    problems: list[str] = []
    add = problems.append
    if not c.data.shards:
        add("data.shards: required (the folder written by data_prep/shard.py)")
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
    k = c.masking
    if not 0 < k.probability < 1:
        add(f"masking.probability: must be in (0, 1), got {k.probability}")
    if k.mask_token_fraction < 0 or k.random_token_fraction < 0 or k.mask_token_fraction + k.random_token_fraction > 1:
        add(f"masking.mask_token_fraction {k.mask_token_fraction} + masking.random_token_fraction "
            f"{k.random_token_fraction} must be non-negative and sum to at most 1")
    o = c.optimizer
    if o.lr <= 0:
        add(f"optimizer.lr: must be > 0, got {o.lr}")
    if not all(0 <= b < 1 for b in o.betas):
        add(f"optimizer.betas: each must be in [0, 1), got {list(o.betas)}")
    if o.eps <= 0 or o.weight_decay < 0:
        add(f"optimizer.eps must be > 0 and optimizer.weight_decay ≥ 0, got {o.eps} and {o.weight_decay}")
    s, t = c.schedule, c.train
    if s.warmup_steps < 0 or s.warmup_steps > t.max_steps:
        add(f"schedule.warmup_steps {s.warmup_steps} must be between 0 and train.max_steps {t.max_steps}")
    if not 0 <= s.end_lr_ratio <= 1 or s.power <= 0:
        add(f"schedule.end_lr_ratio must be in [0, 1] and schedule.power > 0, got {s.end_lr_ratio} and {s.power}")
    if t.max_steps < 1:
        add(f"train.max_steps: must be ≥ 1, got {t.max_steps}")
    problem = batch_problem(t.global_batch_size, t.micro_batch_size, world_size)
    if problem:
        add(problem)
    if t.gradient_clipping < 0:
        add(f"train.gradient_clipping: must be ≥ 0 (0 turns it off), got {t.gradient_clipping}")
    for name in ("log_every", "eval_sequences"):
        if getattr(t, name) < 1:
            add(f"train.{name}: must be ≥ 1, got {getattr(t, name)}")
    if t.eval_every < 0:
        add(f"train.eval_every: must be ≥ 0, got {t.eval_every}")
    if t.peak_tflops is not None and t.peak_tflops <= 0:
        add(f"train.peak_tflops: must be > 0 or null, got {t.peak_tflops}")
    if c.checkpoint.every < 1 or c.checkpoint.keep_last < 1:
        add(f"checkpoint.every and checkpoint.keep_last must be ≥ 1, got {c.checkpoint.every} and "
            f"{c.checkpoint.keep_last}")
    if not c.tracking.experiment:
        add("tracking.experiment: must not be empty")
    problems += deepspeed_problems(c, cuda=cuda)
    if check_files and c.data.shards and c.data.tokenizer:
        problems += data_problems(c)
    return problems


def deepspeed_problems(config: PretrainConfig, *, cuda: bool) -> list[str]:
    ds = config.deepspeed
    problems = [f"deepspeed.{key}: derived by the pipeline; set {where}"
                for key, where in DERIVED_DEEPSPEED_KEYS.items() if key in ds]
    malformed = [f"deepspeed.{name}: expected an object, got {ds[name]!r}"
                 for name in ("bf16", "fp16", "zero_optimization") if name in ds and not isinstance(ds[name], dict)]
    if malformed:
        return problems + malformed
    if ds.get("bf16", {}).get("enabled") and ds.get("fp16", {}).get("enabled"):
        problems.append("deepspeed.bf16.enabled and deepspeed.fp16.enabled: choose one precision")
    if ds.get("fp16", {}).get("enabled") and not cuda:
        problems.append("deepspeed.fp16.enabled: fp16 needs a GPU (DeepSpeed does not support it on CPU); "
                        "use deepspeed.bf16.enabled=true on CPU")
    stage = ds.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        problems.append(f"deepspeed.zero_optimization.stage: expected 0, 1, 2 or 3, got {stage!r}")
    return problems


def data_problems(config: PretrainConfig) -> list[str]:
    """Check the shard folder and tokenizer against each other and the model, without loading shards."""
    from pipeline.data.shard_index import load_index
    from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer

    try:
        index = load_index(config.data.shards)
    except PipelineError as err:
        return [f"data.shards: {err}"]
    problems = []
    try:
        info = describe_tokenizer(load_tokenizer(config.data.tokenizer), config.data.tokenizer)
    except PipelineError as err:
        return [f"data.tokenizer: {err}"]
    if info.fingerprint != index["tokenizer"]["fingerprint"]:
        problems.append(f"data.tokenizer {config.data.tokenizer} is not the tokenizer data.shards "
                        f"{config.data.shards} was made with ({index['tokenizer']['name']})")
    if config.model.architecture == "bert" and index["pack"] != "pairs":
        problems.append(f"model.architecture is bert (MLM + next-sentence prediction), which needs shards "
                        f"packed with --pack pairs; {config.data.shards} holds {index['pack']!r} sequences")
    train = index["splits"]["train"]["sequences"]
    if train < config.train.global_batch_size:
        problems.append(f"data.shards: the train split holds {train} sequences, fewer than one global batch "
                        f"(train.global_batch_size {config.train.global_batch_size})")
    if index["splits"]["val"]["sequences"] == 0:
        problems.append(f"data.shards: {config.data.shards} has no validation sequences; re-run shard.py "
                        "with --val-fraction > 0")
    return problems

