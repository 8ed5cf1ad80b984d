"""launchers/wheelhouse.sh: its package list covers pyproject.toml, and its commands keep the node's torch.

Nothing is downloaded: the script runs with DRY_RUN=1, which prints the pip commands instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib

from helpers import PYTHON, ROOT

LIST = ROOT / "launchers" / "wheelhouse-packages.txt"
HOWS = {"image", "pin", "binary", "build", "tracking"}


def listed() -> dict[str, str]:
    """name → how, from the package list (comments and blank lines skipped)."""
    rows = {}
    for line in LIST.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            rows[fields[0].lower()] = fields[1]
    return rows


def dependencies() -> set[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0].lower() for d in deps}


def dry_run(*args: str, **env: str) -> str:
    done = subprocess.run(["bash", str(ROOT / "launchers" / "wheelhouse.sh"), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": PYTHON, "DRY_RUN": "1", **env}, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_dependency_in_pyproject_is_listed_once_with_how_it_is_got():
    rows = listed()
    missing = dependencies() - set(rows)
    assert not missing, f"add {sorted(missing)} to {LIST.name} (image, binary, build or tracking)"
    assert set(rows) <= dependencies(), f"listed but not a dependency: {sorted(set(rows) - dependencies())}"
    assert set(rows.values()) <= HOWS
    assert rows["torch"] == "image"  # the node's own CUDA build, never from the wheelhouse
    assert rows["deepspeed"] == rows["seqeval"] == "build"  # sdists only on PyPI


def pins() -> dict[str, str]:
    """name → version of the `pin` rows."""
    return {fields[0]: fields[2] for line in LIST.read_text().splitlines()
            if len(fields := line.split("#", 1)[0].split()) >= 3 and fields[1] == "pin"}


def test_transformers_and_tokenizers_are_pinned_to_the_versions_the_tests_run_with():
    """A GPU node's image had transformers 5.17 where these tests had 5.23, and two tests differed there: the
    wheelhouse brings the tests' own versions. When this environment upgrades, the pins must follow."""
    from importlib.metadata import version

    assert set(pins()) == {"transformers", "tokenizers"}
    for name, pinned in pins().items():
        assert version(name) == pinned, f"{LIST.name} pins {name} {pinned}; the tests run {version(name)}: update it"


def test_a_dependency_added_to_pyproject_later_would_fail_the_check(tmp_path):
    text = (ROOT / "pyproject.toml").read_text().replace('"torch>=2.4",', '"torch>=2.4",\n    "einops>=0.8",')
    added = {re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0].lower()
             for d in tomllib.loads(text)["project"]["dependencies"]}
    assert added - set(listed()) == {"einops"}


def test_download_builds_the_sdists_without_ops_and_fetches_the_rest_for_the_nodes_python():
    out = dry_run("download", "/tmp/wheelhouse-never-made", "3.12")
    lines = out.splitlines()
    build = next(line for line in lines if "pip wheel" in line)
    assert "DS_BUILD_OPS=0" in build and "--no-deps" in build and "deepspeed" in build and "seqeval" in build
    downloads = [line for line in lines if "pip download" in line]
    assert downloads and all("--only-binary=:all:" in d and "--python-version 3.12" in d for d in downloads)
    fetched = " ".join(downloads)
    assert "zstandard" in fetched and "datasets" in fetched and "mlflow-skinny" in fetched
    assert not re.search(r"(?<![\w-])torch(?![\w-])", fetched) and "numpy" not in fetched
    for name, version in pins().items():  # the pinned packages at exactly their version
        assert f"{name}=={version}" in fetched
    assert not os.path.exists("/tmp/wheelhouse-never-made")


def test_full_mlflow_or_none_on_request():
    assert re.search(r" mlflow\\?>=", dry_run("download", "/tmp/wheelhouse-never-made", MLFLOW="full"))
    assert "mlflow" not in dry_run("download", "/tmp/wheelhouse-never-made", MLFLOW="none").split("pip download")[-1]


def test_install_is_offline_pins_the_installed_torch_and_installs_the_project_without_dependencies():
    out = dry_run("install", "/tmp/wheelhouse-never-made")
    first, second = [line for line in out.splitlines() if "pip install" in line]
    assert "--no-index" in first and "--find-links" in first and " -c " in first
    assert all(f"{name}=={version}" in first for name, version in pins().items())  # over the image's own
    asked = first.split(" -c ", 1)[1].split(" ", 1)[1]
    assert not re.search(r"(?<![\w-])torch(?![\w-])", asked)  # torch is never asked for
    assert "--no-index" in second and "--no-deps" in second and "-e" in second
    assert "untouched" in out


def test_wheels_the_nodes_image_already_has_can_be_left_out():
    out = dry_run("download", "/tmp/wheelhouse-never-made", LEAVE_OUT="pandas python-dateutil")
    assert "-iname pandas-\\*.whl -delete" in out and "-iname python_dateutil-\\*.whl -delete" in out
