"""released_encoder_finetune's command line: a bad task list stops before any model is loaded or trained, a
part of the benchmark writes its own record instead of replacing the whole one, and a finished seed is reused
only when it was made the same way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules, as when run

from released_encoder_finetune import record_variant, reuse_or_run, seed_identity  # noqa: E402


def test_only_the_whole_benchmark_writes_the_main_record():
    assert record_variant(["sst2", "rte"], no_parity=False) is None
    assert record_variant(["rte"], no_parity=False) == "rte"
    assert record_variant(["sst2", "rte"], no_parity=True) == "sst2-rte-extra-rows"


@pytest.mark.parametrize(("args", "message"), [
    (["--tasks", "sst2,mnli"], "--tasks: expected a subset of sst2,rte, got 'sst2,mnli'"),
    (["--tasks", ""], "--tasks: expected a subset of sst2,rte"),
    (["--no-parity", "--no-scratch"], "leaves nothing to run"),
])
def test_a_bad_command_line_is_refused_with_the_flag_named(args, message, tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/released_encoder_finetune.py", *args, "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert not any(tmp_path.iterdir())  # nothing written


RECIPE = {"lr": 5e-5, "epochs": 3, "batch": 32, "betas": (0.9, 0.999)}
CAPS = {"max_train": None}


def a_model(folder: Path, weights: bytes) -> str:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "bert"}')
    (folder / "model.safetensors").write_bytes(weights)
    return str(folder)


def test_a_finished_seed_is_kept_and_reused_without_running_again(tmp_path):
    model = a_model(tmp_path / "model", b"weights")
    identity = seed_identity("hf", model, "rte", 1, RECIPE, CAPS, scratch=False)
    result_file = tmp_path / "rte" / "hf-seed-1" / "result.json"
    first = reuse_or_run(result_file, identity, lambda: {"best": 0.55, "last": 0.54, "seconds_per_epoch": 300.0})
    again = reuse_or_run(result_file, seed_identity("hf", model, "rte", 1, RECIPE, CAPS, scratch=False),
                         lambda: pytest.fail("a seed made the same way ran again"))
    assert again == first == {"best": 0.55, "last": 0.54, "seconds_per_epoch": 300.0}


@pytest.mark.parametrize(("change", "named"), [
    ({"recipe": {**RECIPE, "lr": 1e-3}}, "recipe.lr 5e-05 there, 0.001 now"),
    ({"weights": b"retrained in place"}, "model_fingerprint"),
    ({"seed": 2}, "seed 1 there, 2 now"),
])
def test_a_seed_made_otherwise_is_refused_naming_the_difference_and_kept(change, named, tmp_path):
    result_file = tmp_path / "result.json"
    model = a_model(tmp_path / "model", b"weights")
    reuse_or_run(result_file, seed_identity("pipeline", model, "rte", 1, RECIPE, CAPS, False), lambda: {"best": 0.5})
    kept = result_file.read_text()
    a_model(tmp_path / "model", change.get("weights", b"weights"))
    now = seed_identity("pipeline", model, "rte", change.get("seed", 1), change.get("recipe", RECIPE), CAPS, False)
    with pytest.raises(SystemExit, match=named):
        reuse_or_run(result_file, now, lambda: pytest.fail("ran over a result made otherwise"))
    assert result_file.read_text() == kept
