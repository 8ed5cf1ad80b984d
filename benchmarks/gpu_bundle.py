"""What the GPU check needs on an offline GPU node, in one ignored folder that the device tool carries.

    python benchmarks/gpu_bundle.py [--data /work/shared/data] [--reviews 20000] [--out .gpu-bundle]

Run it online, before the lease, in the checkout the device tool sends: `OUT/wheels` (the wheelhouse for the
node's Python, without MLflow and the wheels its image has; kept while they hold the pinned versions), `OUT/data`
(the first `--reviews` IMDB reviews and SST-2), `OUT/commit` (the node's `.git` may be stale: bundle again after a
commit). docs/gpu-nodes.md, "Running it inside a lease", has the steps; the size is checked against the carry limit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from itertools import islice
from pathlib import Path

import zstandard
from gpu_check import pinned_versions
from gpu_runs import IMDB, SST2
from harness import ROOT

CARRY_LIMIT_MIB = 64  # the device tool's limit on the tree and the carried paths together
# In the node's image already (the device tool's KINDS.md lists its packages): pandas alone is 12 MiB.
IMAGE_HAS = "pandas python-dateutil pytz tzdata requests urllib3 certifi idna charset-normalizer packaging pyyaml"
NODE_PYTHON = "3.12"


def size_mib(paths: list[Path]) -> float:
    return sum(f.stat().st_size for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()) / 2**20


def tree_mib() -> float:
    """The tracked and untracked-not-ignored files: what the device tool sends besides the carried paths."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    return size_mib([ROOT / name for name in listed if name and (ROOT / name).is_file()])


def first_reviews(source: Path, target: Path, count: int) -> int:
    """The first `count` lines of a .jsonl.zst, recompressed at a high level (the carry limit is tight)."""
    with zstandard.open(source, "rt", encoding="utf-8") as reader:
        lines = list(islice(reader, count))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(zstandard.ZstdCompressor(level=19).compress("".join(lines).encode()))
    return len(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="the full data folder")
    p.add_argument("--reviews", type=int, default=20_000, help="IMDB reviews to carry (the check uses 20,000)")
    p.add_argument("--out", default=str(ROOT / ".gpu-bundle"), help="the folder to carry (git-ignored)")
    a = p.parse_args()
    data, out = Path(a.data), Path(a.out)
    missing = [str(data / f) for f in (IMDB, SST2 / "train.tsv", SST2 / "dev.tsv") if not (data / f).is_file()]
    if missing:
        raise SystemExit(f"error: {', '.join(missing)} not found: give --data, a folder laid out as /work/shared/data")
    wheels = out / "wheels"
    pins = [f"{name}-{version}-*.whl" for name, version in pinned_versions().items()]
    if not all(any(wheels.glob(pin)) for pin in pins):  # a download takes minutes: kept while the pins hold
        shutil.rmtree(wheels, ignore_errors=True)
        env = {**os.environ, "MLFLOW": "none", "LEAVE_OUT": IMAGE_HAS, "PYTHON": sys.executable}
        subprocess.run(["bash", "launchers/wheelhouse.sh", "download", str(wheels), NODE_PYTHON], cwd=ROOT, env=env,
                       check=True)
    shutil.rmtree(out / "data", ignore_errors=True)
    reviews = first_reviews(data / IMDB, out / "data" / IMDB, a.reviews)
    (out / "data" / SST2).mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        shutil.copyfile(data / SST2 / name, out / "data" / SST2 / name)  # not the source's read-only mode
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    (out / "commit").write_text(commit.stdout.strip() + "\n")
    bundle, tree = size_mib([out]), tree_mib()
    print(f"{out}: {bundle:.1f} MiB ({reviews:,} IMDB reviews, SST-2, {len(list(wheels.glob('*.whl')))} wheels); "
          f"with the tree ({tree:.1f} MiB): {bundle + tree:.1f} of {CARRY_LIMIT_MIB} MiB")
    if bundle + tree > CARRY_LIMIT_MIB:
        raise SystemExit(f"error: over the device tool's {CARRY_LIMIT_MIB} MiB: lower --reviews")


if __name__ == "__main__":
    main()
