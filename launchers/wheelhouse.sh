#!/usr/bin/env bash
# Install this project on an offline (air-gapped) GPU node, keeping the node's own CUDA torch.
#
#   Online, on any machine with Python >= 3.11, pip and a torch (deepspeed's build imports it):
#     bash launchers/wheelhouse.sh download WHEELHOUSE [PYTHON_VERSION] [PLATFORM]
#       PYTHON_VERSION: the node's, e.g. 3.12 (default: this Python's); PLATFORM default manylinux2014_x86_64
#   Copy WHEELHOUSE and this checkout to the node, then there:
#     bash launchers/wheelhouse.sh install WHEELHOUSE
#
# What is fetched is launchers/wheelhouse-packages.txt (names, and how each is got), at the version
# ranges of pyproject.toml; `pin` packages (transformers, tokenizers) at exactly the listed version,
# installed over the image's. `image` packages (torch, numpy, ...) are neither downloaded nor
# touched; WITH_IMAGE=1 downloads them too (torch never). MLFLOW=full|skinny|none (default skinny:
# mlflow-skinny + sqlalchemy + alembic, enough for a local sqlite store; none: tracking.enabled=false).
# LEAVE_OUT="name ..." drops those wheels after the download (what the node's image has beyond the list,
# e.g. pandas: a smaller wheelhouse). DRY_RUN=1 prints the commands instead of running them.
# PYTHON picks the interpreter (default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
MLFLOW="${MLFLOW:-skinny}"
LIST="$ROOT/launchers/wheelhouse-packages.txt"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2; exit 2; }
run() {  # print, and run unless DRY_RUN=1
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [ "${DRY_RUN:-0}" != 1 ]; then "$@"; fi
}

# The requirement specifiers (pyproject.toml's ranges) of the packages listed with the given `how`.
specs() {
  "$PYTHON" - "$ROOT/pyproject.toml" "$LIST" "$@" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
by_name = {re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0].lower(): d for d in deps}
wanted = set(sys.argv[3:])
for line in open(sys.argv[2]):
    fields = line.split("#", 1)[0].split()
    if len(fields) >= 2 and fields[1] in wanted:
        print(f"{fields[0]}=={fields[2]}" if fields[1] == "pin" else by_name.get(fields[0].lower(), fields[0]))
PY
}

tracking_specs() {
  case "$MLFLOW" in
    full) specs tracking ;;
    skinny) specs tracking | sed 's/^mlflow/mlflow-skinny/'; echo sqlalchemy; echo alembic ;;
    none) ;;
    *) echo "error: MLFLOW=$MLFLOW: use full, skinny or none" >&2; exit 2 ;;
  esac
}

download() {
  local house="$1" py="${2:-$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}"
  local platform="${3:-manylinux2014_x86_64}"
  run mkdir -p "$house"
  local target=(--only-binary=:all: --python-version "$py" --platform "$platform" --implementation cp -d "$house")
  mapfile -t built < <(specs build)
  # sdists: pure-Python wheels built here (DS_BUILD_OPS=0: no CUDA op is compiled now; each compiles on first use)
  run env DS_BUILD_OPS=0 "$PYTHON" -m pip wheel --no-deps --no-build-isolation -w "$house" "${built[@]}"
  # their own dependencies, as binaries for the node, leaving out torch and what the image has
  local image; image="$(specs image | sed 's/[<>=!~;[ ].*//' | tr '\n' ' ')"
  mapfile -t needs < <(if [ "${DRY_RUN:-0}" = 1 ]; then echo "<Requires-Dist of the built wheels>"; else
    "$PYTHON" - "$house" "$image" "${built[@]}" <<'PY'
import re, sys, zipfile
from pathlib import Path
house, image, built = Path(sys.argv[1]), set(sys.argv[2].lower().split()) | {"torch"}, sys.argv[3:]
names = {re.split(r"[\s<>=!~;\[]", b, maxsplit=1)[0].lower().replace("-", "_") for b in built}
for wheel in house.glob("*.whl"):
    if wheel.name.split("-")[0].lower() not in names:
        continue
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if line.startswith("Requires-Dist:") and "extra ==" not in line:
                req = line.split(":", 1)[1].strip()
                if re.split(r"[\s<>=!~;(\[]", req, maxsplit=1)[0].lower() not in image:
                    print(req.replace(" (", "").replace(")", ""))
PY
  fi)
  if [ "${#needs[@]}" -gt 0 ]; then run "$PYTHON" -m pip download "${target[@]}" "${needs[@]}"; fi
  mapfile -t binary < <(specs binary pin; tracking_specs)
  if [ "${WITH_IMAGE:-0}" = 1 ]; then mapfile -t -O "${#binary[@]}" binary < <(specs image | grep -v '^torch'); fi
  run "$PYTHON" -m pip download "${target[@]}" "${binary[@]}"
  # pip download brings every dependency; what the image has (numpy, pyarrow, ...: tens of MiB) goes again
  if [ "${WITH_IMAGE:-0}" != 1 ]; then
    local name; for name in $image; do run find "$house" -maxdepth 1 -iname "${name//-/_}-*.whl" -delete; done
  fi
  local left; for left in ${LEAVE_OUT:-}; do run find "$house" -maxdepth 1 -iname "${left//-/_}-*.whl" -delete; done
  echo "wheelhouse: $house ($(du -sh "$house" 2>/dev/null | cut -f1)) for Python $py on $platform"
}

install() {
  local house="$1"
  [ -d "$house" ] || [ "${DRY_RUN:-0}" = 1 ] || { echo "error: no wheelhouse at $house" >&2; exit 2; }
  local torch_before
  torch_before="$("$PYTHON" -c 'from importlib.metadata import version; print(version("torch"))' 2>/dev/null)" || {
    echo "error: $PYTHON has no torch: install the node's CUDA torch first (the wheelhouse never brings one)" >&2
    exit 2; }
  local pin; pin="$(mktemp)"; trap 'rm -f "$pin"' RETURN
  echo "torch==$torch_before" > "$pin"  # the resolver may keep this torch and nothing else
  mapfile -t wanted < <(specs build binary pin; tracking_specs)
  run "$PYTHON" -m pip install --no-index --find-links "$house" -c "$pin" "${wanted[@]}"
  # the project itself: its dependencies are now all there (mlflow-skinny stands in for mlflow)
  run "$PYTHON" -m pip install --no-index --no-deps --no-build-isolation -e "$ROOT"
  local torch_after; torch_after="$("$PYTHON" -c 'from importlib.metadata import version; print(version("torch"))')"
  if [ "$torch_after" != "$torch_before" ]; then
    echo "error: torch changed from $torch_before to $torch_after; reinstall the node's CUDA build" >&2; exit 1
  fi
  echo "installed from $house; torch $torch_after untouched"
}

case "${1:-}" in
  download) [ $# -ge 2 ] || usage; shift; download "$@" ;;
  install) [ $# -eq 2 ] || usage; install "$2" ;;
  *) usage ;;
esac
