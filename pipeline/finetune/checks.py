"""The fine-tuning config's checks: every cross-field rule, run by `finetune_problems`.

`config.load_finetune_config` checks types and unknown keys (`config_tree`), then calls
`finetune_problems`: the task and its data (files only with `check_files`), the batch against the
processes, upper bounds from pipeline/common/size_limits.py, and the optimizer's ranges. Each problem
names its keys; the loader raises them all in one ConfigError.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.common import size_limits as lim
from pipeline.finetune.config import BATCH_KEYS, SPAN_TASKS, FinetuneConfig
from pipeline.finetune.tasks import GLUE_TASKS, task_spec
from pipeline.pretrain.batch_plan import batch_problem


def finetune_problems(c: FinetuneConfig, world_size: int = 1, *, check_files: bool = True) -> list[str]:
    """Every problem with the config's types, keys and cross-field rules; with `check_files`, missing data too."""
    problems = []
    add = problems.append
    d, t = c.data, c.train
    if c.task in SPAN_TASKS:
        problems += span_task_problems(c, check_files)
    elif c.task != "custom":
        try:
            task_spec(c.task)
        except Exception:  # noqa: BLE001
            add(f"task: {c.task!r} is not a GLUE task ({', '.join(GLUE_TASKS)}), 'custom', or one of "
                f"{', '.join(SPAN_TASKS)}")
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
    for name in ("batch_size", "epochs", "eval_batch_size"):
        if getattr(t, name) < 1:
            add(f"train.{name}: must be ≥ 1, got {getattr(t, name)}")
    if t.batch_size >= 1:
        micro = t.micro_batch_size or max(1, t.batch_size // world_size)
        if problem := batch_problem(t.batch_size, micro, world_size, keys=BATCH_KEYS):
            add(problem)
    if not t.collective_timeout_s > 0:
        add(f"train.collective_timeout_s: must be > 0 seconds, got {t.collective_timeout_s}")
    # Upper bounds only (the lower ones are checked above): a typo must not allocate absurd memory.
    problems += lim.bound_problems([("data.max_seq_len", d.max_seq_len, lim.MAX_SEQ_LEN),
                                    ("data.doc_stride", d.doc_stride, lim.MAX_SEQ_LEN),
                                    ("data.max_answer_length", d.max_answer_length, lim.MAX_SEQ_LEN),
                                    ("data.n_best", d.n_best, lim.MAX_SEQ_LEN),
                                    ("train.batch_size", t.batch_size, lim.MAX_GLOBAL_BATCH),
                                    ("train.micro_batch_size", t.micro_batch_size, lim.MAX_MICRO_BATCH),
                                    ("train.eval_batch_size", t.eval_batch_size, lim.MAX_MICRO_BATCH)],
                                   minimum=-(1 << 62))
    if not all(0 <= b < 1 for b in t.adam_betas) or t.adam_eps <= 0:
        add(f"train.adam_betas must be in [0, 1) and train.adam_eps > 0, got {list(t.adam_betas)} and {t.adam_eps}")
    if t.learning_rate <= 0 or not 0 <= t.warmup_ratio < 1:
        add(f"train.learning_rate must be > 0 and train.warmup_ratio in [0, 1), got {t.learning_rate} and "
            f"{t.warmup_ratio}")
    return problems


def span_task_problems(c: FinetuneConfig, check_files: bool = True) -> list[str]:
    """Problems of a token-tagging or QA task's data section (`check_files`: and whether its files exist)."""
    problems = []
    add = problems.append
    d = c.data
    for name in ("train_file", "validation_file", "test_file"):
        value = getattr(d, name)
        if value is None and name != "test_file" or value == "":
            add(f"data.{name}: required for task {c.task!r}")
        elif check_files and value is not None and not Path(value).is_file():
            add(f"data.{name}: {value} does not exist")
    if d.glue_dir or d.use_datasets:
        add(f"data.glue_dir / data.use_datasets: task {c.task!r} reads data.train_file and data.validation_file")
    if c.task in ("squad", "qa-custom"):
        if stride_problem := doc_stride_problem(d.doc_stride, d.max_seq_len):
            add(stride_problem)
        if d.n_best < 1 or d.max_answer_length < 1:
            add(f"data.n_best and data.max_answer_length must be ≥ 1, got {d.n_best} and {d.max_answer_length}")
    return problems


def doc_stride_problem(doc_stride: int, max_seq_len: int) -> str | None:
    """QA windows overlap by `doc_stride` tokens, so a window must hold more than twice the overlap."""
    if 0 < doc_stride < max_seq_len // 2:
        return None
    return f"data.doc_stride: must be > 0 and under half of data.max_seq_len ({max_seq_len}), got {doc_stride}"
