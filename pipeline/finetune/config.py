"""The fine-tuning config (configs/glue/<task>.json): task, data source, training recipe, tracking."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from pipeline.common.lost_rank import DEFAULT_COLLECTIVE_TIMEOUT_S
from pipeline.common.precision import Precision
from pipeline.common.run_kernel import load_config
from pipeline.common.run_layout import FinetuneLayout
from pipeline.pretrain.batch_plan import BatchPlan
from pipeline.pretrain.config import TrackingConfig

SPAN_TASKS = ("ner", "pos", "token-custom", "squad", "qa-custom")
"""Token tagging and extractive QA tasks: read from data.train_file / validation_file / test_file."""


@dataclass
class FinetuneDataConfig:
    glue_dir: str | None = None
    """A folder in the GLUE layout (`<glue_dir>/SST-2/train.tsv`, …)."""
    use_datasets: bool = False
    """Read ("glue", task) with `datasets` instead (needs the hub or its cache)."""
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    text_fields: list[str] = field(default_factory=list)
    label_field: str = "label"
    task_type: Literal["classification", "regression"] = "classification"
    labels: list[str] | None = None
    """Custom classification labels in class-id order; None: the sorted labels of the train file."""
    max_seq_len: int = 128
    max_train_examples: int | None = None
    """Use only the first N training examples (quick runs)."""
    label_all_tokens: bool = False
    """Token tasks: label every sub-token of a word (a `B-X` word's later pieces as `I-X`), not only the first."""
    map_unknown_tags_to_o: bool = False
    """Token tasks: read a dev/test tag that the train file never has as `O`, instead of stopping with an error."""
    doc_stride: int = 128
    """QA: tokens of overlap between consecutive windows of a context longer than max_seq_len."""
    n_best: int = 20
    """QA: start and end candidates per window paired into answer spans."""
    max_answer_length: int = 30
    """QA: the longest answer considered, in tokens."""
    version_2_with_negative: bool | None = None
    """QA: questions may have no answer (SQuAD 2.0); None: when the train or dev file has unanswerable ones."""
    null_score_diff_threshold: float = 0.0
    """QA with no-answer: answer "" when the no-answer score beats the best span's by more than this (logits)."""


@dataclass
class FinetuneTrainConfig:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {
        "mixed_precision": 'write train.precision: "fp32" (was "no"), "bf16" or "fp16"'}

    output_dir: str = "runs/finetune"
    learning_rate: float = 2e-5
    batch_size: int = 32
    """Examples per optimizer step, over all processes (RoBERTa's GLUE recipe: 16 or 32)."""
    micro_batch_size: int | None = None
    """Examples per process per forward pass; None: batch_size ÷ processes. Accumulation is derived."""
    epochs: int = 10
    warmup_ratio: float = 0.06
    weight_decay: float = 0.1
    adam_betas: tuple[float, float] = (0.9, 0.98)
    """AdamW β1, β2 (RoBERTa's GLUE recipe)."""
    adam_eps: float = 1e-6
    """AdamW ε (RoBERTa's GLUE recipe)."""
    max_grad_norm: float = 1.0
    seed: int = 1
    precision: Precision = "fp32"
    """Training precision: `fp32`, or `bf16` / `fp16` autocast (fp16 with a gradient scaler, GPU only)."""
    eval_batch_size: int = 64
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    """Seconds a process waits on the others (one collective, or one micro batch after the first) before it
    decides one is dead or stuck and exits with an error (see pipeline/common/lost_rank.py)."""


@dataclass
class FinetuneConfig:
    task: str = "sst2"
    """A GLUE task name, `custom`, a token task (`ner`, `pos`, `token-custom`) or a QA task (`squad`, `qa-custom`)."""
    name: str | None = None
    """What tracking and the comparison table call this task; None: `task`. Name each custom task, so that two
    of them in one MLflow store keep their metrics apart (`keywords/accuracy`, not both `custom/accuracy`)."""
    data: FinetuneDataConfig = field(default_factory=FinetuneDataConfig)
    train: FinetuneTrainConfig = field(default_factory=FinetuneTrainConfig)
    tracking: TrackingConfig = field(default_factory=lambda: TrackingConfig(experiment="finetune"))

    @property
    def task_name(self) -> str:
        """The task's name in MLflow tags, run names and the comparison table's columns."""
        return self.name or self.task

    @property
    def output_dir(self) -> Path:
        return Path(self.train.output_dir)

    @property
    def layout(self) -> FinetuneLayout:
        """Every path in the output folder."""
        return FinetuneLayout(self.output_dir)

    def batch_plan(self, world_size: int) -> BatchPlan:
        """train.batch_size = micro batch × processes × accumulation."""
        t = self.train
        micro = t.micro_batch_size or max(1, t.batch_size // world_size)
        return BatchPlan.derive(t.batch_size, micro, world_size, keys=BATCH_KEYS)


BATCH_KEYS = ("train.batch_size", "train.micro_batch_size")


def load_finetune_config(path: str | Path, overrides: list[str] = (), *, world_size: int = 1,
                         check_files: bool = True) -> FinetuneConfig:
    """Read, override and validate a fine-tuning config for `world_size` processes; all problems at once.

    `check_files=False` checks types, keys and cross-field rules only, not that the data exists.
    """
    # checks.py imports this module's sections, so its rules are imported here, not at the top.
    from pipeline.finetune.checks import finetune_problems

    return load_config(FinetuneConfig, path, overrides,
                       lambda config, _: finetune_problems(config, world_size, check_files=check_files))
