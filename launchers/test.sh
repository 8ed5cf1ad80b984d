#!/usr/bin/env bash
# The test suite: set up the environment, lint, then run pytest (extra arguments go to pytest).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/launchers/setup_env.sh"
cd "$ROOT"
python -m ruff check --quiet .
exec python -m pytest "$@"
