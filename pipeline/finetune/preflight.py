"""Before fine-tuning starts: the config, its batch on the processes, and the data files it names.

`load_finetune_config(path, overrides, world_size=)` reads JSON and `--set` overrides, builds the
config (each section checks itself, `FinetuneConfig` the task against its data: config.py), then
adds the batch on `world_size` processes (batch_plan.py) and, with `check_files`, whether the data
folder and files exist; every problem names its key, all in one ConfigError.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.common.processes.batch_plan import batch_problem
from pipeline.common.run_kernel import load_config
from pipeline.data.tasks.catalog import SPAN_TASKS
from pipeline.finetune.config import BATCH_KEYS, FinetuneConfig
from pipeline.finetune.families.embedding.config import EMBEDDING_TASKS


def load_finetune_config(path: str | Path, overrides: list[str] = (), *, world_size: int = 1,
                         check_files: bool = True) -> FinetuneConfig:
    """Read, override and check a fine-tuning config for `world_size` processes; all problems at once.

    `check_files=False` checks types, keys and the rules between them only, not that the data exists.
    """
    return load_config(FinetuneConfig, path, overrides,
                       lambda config, _: preflight_problems(config, world_size, check_files=check_files))


def preflight_problems(config: FinetuneConfig, world_size: int = 1, *, check_files: bool = True) -> list[str]:
    """The batch on `world_size` processes and, with `check_files`, the data the config names."""
    problems = []
    t = config.train
    if t.batch_size >= 1:
        if problem := batch_problem(t.batch_size, t.micro_batch(world_size), world_size, keys=BATCH_KEYS):
            problems.append(problem)
    return problems + (file_problems(config) if check_files else [])


def file_problems(config: FinetuneConfig) -> list[str]:
    """The GLUE folder, or the task's files, that the config names and that are not there."""
    d = config.data
    own_files = (*SPAN_TASKS, *EMBEDDING_TASKS)
    if config.task not in own_files and config.task != "custom":  # a GLUE task
        return [f"data.glue_dir: {d.glue_dir} is not a folder"] if d.glue_dir and not Path(d.glue_dir).is_dir() else []
    names = ["train_file", "validation_file"] + (["test_file"] if config.task in own_files else [])
    named = {name: getattr(d, name) for name in names if getattr(d, name)}
    if config.task == "embed-corpus":
        return corpus_problems(named)
    return [f"data.{name}: {path} does not exist" for name, path in named.items() if not Path(path).is_file()]


def corpus_problems(named: dict[str, str]) -> list[str]:
    """`embed-corpus` reads what the sharder reads: a file, a folder or a glob of .txt, .jsonl or .parquet."""
    from pipeline.common.errors import PipelineError
    from pipeline.data.corpus import resolve_inputs

    problems = []
    for name, path in named.items():
        try:
            resolve_inputs([path])
        except PipelineError as err:
            problems.append(f"data.{name}: {str(err).removeprefix('--input ')}")
    return problems
