#!/usr/bin/env bash
# The test suite: set up the environment, lint, then run pytest (extra arguments go to pytest).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/launchers/setup_env.sh"
cd "$ROOT"
python -m ruff check --quiet .
# The SLURM tests stand a cluster up from Debian's packages: installed here, with the Python ones, because no test
# reaches the network. Without root or a reachable registry those tests skip and say why.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! bash tests/slurm/install.sh; then
  echo "test.sh: SLURM's packages could not be installed; the SLURM tests will skip" >&2
fi
# Two workers (pytest-xdist), each test file on one of them so its shared runs start once: a 2-core
# machine sat idle about 40% of a serial run (process start-ups, waits on launches). `-n 0` runs serially.
exec python -m pytest -n 2 --dist loadfile "$@"
