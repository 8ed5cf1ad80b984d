#!/usr/bin/env bash
# Create or update the project's virtual environment; sourced by demo.sh and test.sh.
#
# torch is installed first and only if the environment has none: here `pip install torch==2.13.0`
# takes the local CPU build, and a GPU user who installed a CUDA torch into .venv beforehand keeps
# it (every other dependency accepts any torch >= 2.4). Re-runs are no-ops until pyproject.toml
# changes. VENV=/path picks another environment; TORCH_SPEC='torch==X' another torch.
# Exports PATH, VIRTUAL_ENV and TORCH_EXTENSIONS_DIR (<venv>/torch_extensions unless already set).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "error: Python 3.11 or newer is needed ($PYTHON is $("$PYTHON" --version 2>&1)); set PYTHON=..." >&2
    exit 2
  }
  echo "setup: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.roberta-pipeline-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-64)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    echo "setup: installing ${TORCH_SPEC:-torch==2.13.0} first (the CPU build, no CUDA packages)"
    "$VENV/bin/python" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
  fi
  echo "setup: installing roberta-pipeline and its dependencies"
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
  # MLflow's schema migrations, once: every new sqlite store starts as a copy (pipeline/tracking/sqlite_store.py)
  "$VENV/bin/python" -m pipeline.tracking.sqlite_store
  echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
# DeepSpeed's JIT-compiled ops (its CPU Adam for offload, its shared-memory comm op where asked for) are built
# once per environment into a folder of its own: the shared ~/.cache/torch_extensions is rebuilt whenever another
# environment used it last. pipeline.common.processes.topology applies the same default to `deepspeed launchers/pretrain.py`.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$VENV/torch_extensions}"
