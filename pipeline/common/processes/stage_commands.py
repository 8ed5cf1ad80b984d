"""A stage started as its own process, found by module (`python -m pipeline.commands.<name>`), not by path.

Orchestrators (the main job, the ablation runner) start each stage as a user would type it. Naming
the module rather than a script file keeps them working from an installed package, where no
`launchers/` or `data_prep/` folder exists.
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Mapping
from pathlib import Path

import pipeline

COMMANDS_PACKAGE = "pipeline.commands"


def stage_module(name: str) -> str:
    """`shard` → `pipeline.commands.shard`."""
    return f"{COMMANDS_PACKAGE}.{name}"


def stage_command(name: str, launcher: list[str] | None = None) -> list[str]:
    """The argv that runs stage `name`: `python -m …`, or under `launcher` with `--module`.

    torchrun (`torch.distributed.run`), the deepspeed launcher and `accelerate launch` all take
    `--module MODULE` in place of a script (the deepspeed launcher has no `-m`).
    """
    if launcher is None:
        return [sys.executable, "-m", stage_module(name)]
    return [*launcher, "--module", stage_module(name)]


def stage_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the folder of the imported `pipeline` package first on PYTHONPATH.

    A stage then imports the same `pipeline` as its parent, whether that is an installed package or a
    checkout made importable by a launcher script, and whatever the working folder.
    """
    env = dict(os.environ if env is None else env)
    home = str(Path(pipeline.__file__).resolve().parent.parent)
    if home in {str(Path(p).resolve()) for p in [*site.getsitepackages(), site.getusersitepackages()]}:
        return env  # installed: every interpreter of this environment finds it already
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != home]
    env["PYTHONPATH"] = os.pathsep.join([home, *rest])
    return env
