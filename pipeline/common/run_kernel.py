"""What every stage's run does the same way: load its config, seed, and describe itself to MLflow.

Pretraining and fine-tuning both call these, so a config error reads the same, a seed means the
same thing, and their MLflow runs carry the same tags (and can be compared on them).
"""

from __future__ import annotations

import importlib.metadata
import platform
import random
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pipeline.common.config.tree import ConfigError, apply_overrides, build_tree, read_json_config

T = TypeVar("T")

TRACKED_LIBRARIES = ("torch", "transformers", "deepspeed", "accelerate", "datasets", "tokenizers")
"""Installed versions recorded as `<name>_version` tags on every run."""


def load_config(cls: type[T], path: str | Path, overrides: list[str] | tuple[str, ...],
                checks: Callable[[T, bool], list[str]]) -> T:
    """Read JSON, apply `--set` overrides, build `cls`, run `checks`; all problems in one ConfigError.

    Each section checks its own values as it is built (`config_tree.build_tree`); `checks(config, typed)`
    returns what else the stage checks (its preflight); `typed` is False when some value had the wrong
    type or key (its default stands in), so checks that read files can stand back.
    """
    data = apply_overrides(read_json_config(path), list(overrides))
    source = str(path) + (f" (with {len(overrides)} --set override{'s' * (len(overrides) != 1)})" if overrides else "")
    config, wrong, refused = build_tree(cls, data)
    problems = wrong + refused + checks(config, not wrong)
    if problems:
        raise ConfigError(source, problems)
    return config


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators (all devices): the same initial weights on every rank."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_tags(stage: str, world_size: int, **extra: object) -> dict[str, str]:
    """The tags every MLflow run carries: stage, git commit, world size, library versions; plus `extra`."""
    tags = {"stage": stage, "git_commit": git_commit(), "world_size": str(world_size),
            "python_version": platform.python_version()}
    for name in TRACKED_LIBRARIES:
        try:
            tags[f"{name}_version"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return tags | {k: "" if v is None else str(v) for k, v in extra.items()}
