"""The fine-tuning config (configs/glue/<task>.json): task, data source, training recipe, tracking.

Each section checks its own values when it is built (`__post_init__`), `FinetuneConfig` the rules
between the task and its data; preflight.py's `load_finetune_config` reads the file and adds the
batch on the processes and whether the data exists, all in one ConfigError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from pipeline.common.config import size_limits as lim
from pipeline.common.config.tree import refuse
from pipeline.common.errors import PipelineError
from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.common.processes.lost_rank import DEFAULT_COLLECTIVE_TIMEOUT_S
from pipeline.common.run_layout import FinetuneLayout
from pipeline.data.tasks.catalog import GLUE_TASKS, QA_TASKS, SPAN_TASKS, task_spec
from pipeline.finetune.families.embedding.config import EMBEDDING_TASKS, EmbeddingConfig
from pipeline.finetune.families.embedding.options import task_problems as embedding_task_problems
from pipeline.models.precision import Precision
from pipeline.tracking.settings import TrackingConfig


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

    def __post_init__(self):
        problems = []
        if self.max_seq_len < 8:
            problems.append(f"data.max_seq_len: must be ≥ 8, got {self.max_seq_len}")
        # Upper bounds only (the lower ones are checked with the task): a typo must not allocate absurd memory.
        problems += lim.bound_problems([("data.max_seq_len", self.max_seq_len, lim.MAX_SEQ_LEN),
                                        ("data.doc_stride", self.doc_stride, lim.MAX_SEQ_LEN),
                                        ("data.max_answer_length", self.max_answer_length, lim.MAX_SEQ_LEN),
                                        ("data.n_best", self.n_best, lim.MAX_SEQ_LEN)], minimum=-(1 << 62))
        refuse(self, problems)


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
    decides one is dead or stuck and exits with an error (see pipeline/common/processes/lost_rank.py)."""

    def __post_init__(self):
        problems = []
        add = problems.append
        for name in ("batch_size", "epochs", "eval_batch_size"):
            if getattr(self, name) < 1:
                add(f"train.{name}: must be ≥ 1, got {getattr(self, name)}")
        if not self.collective_timeout_s > 0:
            add(f"train.collective_timeout_s: must be > 0 seconds, got {self.collective_timeout_s}")
        problems += lim.bound_problems([("train.batch_size", self.batch_size, lim.MAX_GLOBAL_BATCH),
                                        ("train.micro_batch_size", self.micro_batch_size, lim.MAX_MICRO_BATCH),
                                        ("train.eval_batch_size", self.eval_batch_size, lim.MAX_MICRO_BATCH)],
                                       minimum=-(1 << 62))
        if not all(0 <= b < 1 for b in self.adam_betas) or self.adam_eps <= 0:
            add(f"train.adam_betas must be in [0, 1) and train.adam_eps > 0, got {list(self.adam_betas)} and "
                f"{self.adam_eps}")
        if self.learning_rate <= 0 or not 0 <= self.warmup_ratio < 1:
            add(f"train.learning_rate must be > 0 and train.warmup_ratio in [0, 1), got {self.learning_rate} and "
                f"{self.warmup_ratio}")
        refuse(self, problems)

    def micro_batch(self, world_size: int) -> int:
        """Examples per process per forward pass: `micro_batch_size`, by default the batch split over the processes."""
        return self.micro_batch_size or max(1, self.batch_size // world_size)


@dataclass
class FinetuneConfig:
    task: str = "sst2"
    """A GLUE task name, `custom`, a token task (`ner`, `pos`, `token-custom`), a QA task (`squad`, `qa-custom`) or
    an embedding task (`embed-pairs`, `embed-sts`, `embed-simcse`, `embed-sparse`, `embed-corpus`)."""
    name: str | None = None
    """What tracking and the comparison table call this task; None: `task`. Name each custom task, so that two
    of them in one MLflow store keep their metrics apart (`keywords/accuracy`, not both `custom/accuracy`)."""
    data: FinetuneDataConfig = field(default_factory=FinetuneDataConfig)
    train: FinetuneTrainConfig = field(default_factory=FinetuneTrainConfig)
    tracking: TrackingConfig = field(default_factory=lambda: TrackingConfig(experiment="finetune"))
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    """Embedding tasks only: pooling, the loss's scale and cache, the STS score range, and the training options
    (hard negatives, Matryoshka widths, prompts; docs/embeddings.md)."""

    def __post_init__(self):
        """The task against its data section; the data's files are the preflight's (they may not exist here)."""
        problems = []
        add = problems.append
        d = self.data
        if self.task in SPAN_TASKS or self.task in EMBEDDING_TASKS:
            problems += self._span_task_problems()
        elif self.task != "custom":
            try:
                task_spec(self.task)
            except PipelineError:
                add(f"task: {self.task!r} is not a GLUE task ({', '.join(GLUE_TASKS)}), 'custom', or one of "
                    f"{', '.join(SPAN_TASKS + EMBEDDING_TASKS)}")
            if not d.glue_dir and not d.use_datasets:
                add("data.glue_dir: required for a GLUE task (or set data.use_datasets=true)")
        else:
            for name in ("train_file", "validation_file"):
                if not getattr(d, name):
                    add(f"data.{name}: required for a custom task")
            if not 1 <= len(d.text_fields) <= 2:
                add(f"data.text_fields: a custom task needs 1 or 2 text columns, got {d.text_fields}")
        refuse(self, problems)

    def _span_task_problems(self) -> list[str]:
        """A token-tagging, QA or embedding task's data section: its own files."""
        problems = []
        add = problems.append
        d = self.data
        for name in ("train_file", "validation_file", "test_file"):
            value = getattr(d, name)
            if value is None and name != "test_file" or value == "":
                add(f"data.{name}: required for task {self.task!r}")
        if d.glue_dir or d.use_datasets:
            add(f"data.glue_dir / data.use_datasets: task {self.task!r} reads data.train_file and "
                "data.validation_file")
        if self.task in QA_TASKS:
            if stride_problem := doc_stride_problem(d.doc_stride, d.max_seq_len):
                add(stride_problem)
            if d.n_best < 1 or d.max_answer_length < 1:
                add(f"data.n_best and data.max_answer_length must be ≥ 1, got {d.n_best} and {d.max_answer_length}")
        if self.task in EMBEDDING_TASKS:
            problems += embedding_task_problems(self.embedding, self.task)
        return problems

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

    def capped_to(self, model: str, *, say: bool = True) -> FinetuneConfig:
        """This config with `data.max_seq_len` at most what `model` can take, saying so (with `say`) when it cuts.

        A longer input would index past the position table and crash inside the embeddings; HF's run_glue caps
        the length the same way. A QA stride that no longer fits the capped windows is an error.
        """
        import dataclasses

        from transformers import AutoConfig

        from pipeline.models.model_source import position_limit

        limit = position_limit(AutoConfig.from_pretrained(model))
        asked = self.data.max_seq_len
        if asked <= limit:
            return self
        if self.task in QA_TASKS and (problem := doc_stride_problem(self.data.doc_stride, limit)):
            raise PipelineError(f"{problem}: data.max_seq_len {asked} is capped to {limit}, the most tokens {model} "
                                f"takes (its position embeddings); lower data.doc_stride")
        if say:
            print(f"data.max_seq_len {asked}: {model} takes at most {limit} tokens (its position embeddings); "
                  f"fine-tuning uses {limit}", flush=True)
        return dataclasses.replace(self, data=dataclasses.replace(self.data, max_seq_len=limit))

    def batch_plan(self, world_size: int) -> BatchPlan:
        """train.batch_size = micro batch × processes × accumulation."""
        return BatchPlan.derive(self.train.batch_size, self.train.micro_batch(world_size), world_size, keys=BATCH_KEYS)


BATCH_KEYS = ("train.batch_size", "train.micro_batch_size")


def doc_stride_problem(doc_stride: int, max_seq_len: int) -> str | None:
    """QA windows overlap by `doc_stride` tokens, so a window must hold more than twice the overlap."""
    if 0 < doc_stride < max_seq_len // 2:
        return None
    return f"data.doc_stride: must be > 0 and under half of data.max_seq_len ({max_seq_len}), got {doc_stride}"
