"""Test harness: one process runs several `launchers/finetune.py` command lines in turn.

    python tests/dist/finetune_each_family.py PLAN.json

PLAN.json is a list of argument lists, each what a user would pass to launchers/finetune.py. One
process for all of them pays the imports (torch, transformers, accelerate: ~10 s here) once.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "launchers")]


def main() -> None:
    import finetune  # launchers/finetune.py

    for argv in json.loads(Path(sys.argv[1]).read_text()):
        finetune.main(argv)


if __name__ == "__main__":
    main()
