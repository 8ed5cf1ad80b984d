"""The fine-tuning config (configs/glue/<task>.json): task, data source, training recipe, tracking."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.common.config_tree import ConfigError, apply_overrides, build_config, read_json_config
from pipeline.finetune.tasks import GLUE_TASKS, task_spec
from pipeline.pretrain.config import TrackingConfig


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


@dataclass
class FinetuneTrainConfig:
    output_dir: str = "runs/finetune"
    learning_rate: float = 2e-5
    batch_size: int = 32
    gradient_accumulation: int = 1
    epochs: int = 10
    warmup_ratio: float = 0.06
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    seed: int = 1
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    eval_batch_size: int = 64


@dataclass
class FinetuneConfig:
    task: str = "sst2"
    """A GLUE task name, or `custom`."""
    data: FinetuneDataConfig = field(default_factory=FinetuneDataConfig)
    train: FinetuneTrainConfig = field(default_factory=FinetuneTrainConfig)
    tracking: TrackingConfig = field(default_factory=lambda: TrackingConfig(experiment="finetune"))

    @property
    def output_dir(self) -> Path:
        return Path(self.train.output_dir)


def load_finetune_config(path: str | Path, overrides: list[str] = (), *, check_files: bool = True) -> FinetuneConfig:
    """Read, override and validate a fine-tuning config; `check_files=False` skips checking that its data exists."""
    data = apply_overrides(read_json_config(path), list(overrides))
    source = str(path) + (" (with --set overrides)" if overrides else "")
    config, problems = build_config(FinetuneConfig, data)
    problems += finetune_problems(config, check_files=check_files)
    if problems:
        raise ConfigError(source, problems)
    return config


def finetune_problems(c: FinetuneConfig, *, check_files: bool = True) -> list[str]:
    """Every problem with the config's types, keys and cross-field rules; with `check_files`, missing data too."""
    problems = []
    add = problems.append
    d, t = c.data, c.train
    if c.task != "custom":
        try:
            task_spec(c.task)
        except Exception:  # noqa: BLE001
            add(f"task: {c.task!r} is not a GLUE task ({', '.join(GLUE_TASKS)}) or 'custom'")
        if not d.glue_dir and not d.use_datasets:
            add("data.glue_dir: required for a GLUE task (or set data.use_datasets=true)")
        elif check_files and d.glue_dir and not Path(d.glue_dir).is_dir():
            add(f"data.glue_dir: {d.glue_dir} is not a folder")
    else:
        for name in ("train_file", "validation_file"):
            value = getattr(d, name)
            if not value:
                add(f"data.{name}: required for a custom task")
            elif check_files and not Path(value).is_file():
                add(f"data.{name}: {value} does not exist")
        if not 1 <= len(d.text_fields) <= 2:
            add(f"data.text_fields: a custom task needs 1 or 2 text columns, got {d.text_fields}")
    if d.max_seq_len < 8:
        add(f"data.max_seq_len: must be ≥ 8, got {d.max_seq_len}")
    for name in ("batch_size", "gradient_accumulation", "epochs", "eval_batch_size"):
        if getattr(t, name) < 1:
            add(f"train.{name}: must be ≥ 1, got {getattr(t, name)}")
    if t.learning_rate <= 0 or not 0 <= t.warmup_ratio < 1:
        add(f"train.learning_rate must be > 0 and train.warmup_ratio in [0, 1), got {t.learning_rate} and "
            f"{t.warmup_ratio}")
    return problems
