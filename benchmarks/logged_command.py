"""One benchmark stage as a subprocess whose output goes to its own log, so parallel stages stay readable."""

from __future__ import annotations

import subprocess
from pathlib import Path


def run_logged(cmd: list, log: Path, *, cwd: Path, env: dict, append: bool = False) -> None:
    """Run `cmd` (any items, made strings) with stdout and stderr into `log`; the command line is printed first."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print("$", " ".join(map(str, cmd)), f"> {log}", flush=True)
    with open(log, "a" if append else "w") as file:
        subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, check=True, stdout=file, stderr=subprocess.STDOUT)
