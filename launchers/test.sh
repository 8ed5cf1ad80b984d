#!/usr/bin/env bash
# The test suite: set up the environment, lint, then run pytest (extra arguments go to pytest).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/launchers/setup_env.sh"
cd "$ROOT"
python -m ruff check --quiet .
# Two workers (pytest-xdist), each test file on one of them so its shared runs start once: a 2-core
# machine sat idle about 40% of a serial run (process start-ups, waits on launches). `-n 0` runs serially.
exec python -m pytest -n 2 --dist loadfile "$@"
