#!/usr/bin/env bash
# The main job: set up the environment, then run every stage on the embedded default corpus.
# Usage: bash launchers/demo.sh [--out runs/default] [--fresh]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/launchers/setup_env.sh"
cd "$ROOT"
exec python launchers/run_default.py "$@"
