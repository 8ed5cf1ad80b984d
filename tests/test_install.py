"""The package works as a user gets it: a wheel installed into a fresh environment, used from any folder.

The wheel is built from this checkout and installed (without dependencies) into a new virtual
environment that borrows this one's libraries (torch, deepspeed, transformers, …) through a
`.pth` line. That line adds the folder to the import path without running its own `.pth` files,
so an editable install of this checkout cannot leak in: `pipeline` and the shipped configs come
from the wheel or not at all. From a temporary folder outside the checkout, the console scripts
then run tokenizer → shards → a few pretraining steps (a shipped config by name) → export →
fine-tuning a tiny task for one epoch (a shipped fine-tuning config by name).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT, make_documents, write_jsonl

pytestmark = pytest.mark.slow


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    """Run a command; its standard output (a failure shows both streams)."""
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    print(f"{Path(cmd[0]).name}: {time.monotonic() - started:.1f} s")
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """A fresh environment holding the wheel: its bin folder and a clean environment for its commands."""
    base = tmp_path_factory.mktemp("install")
    # Built from a copy of what the wheel is made of: a build in the checkout would leave build/ there,
    # whose stale files a later build would ship.
    source = base / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pipeline", "configs"):
        shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(base / "wheel"), str(source)], check=True, capture_output=True, timeout=300)
    wheel = next((base / "wheel").glob("roberta_pipeline-*.whl"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # This environment's libraries, after the new one's own (so the wheel's `pipeline` wins).
    site.joinpath("parent-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONNOUSERSITE="1",
               # The comm op DeepSpeed compiles once per environment: reuse this one's build.
               TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions")))
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)], base, env)
    return {"wheel": wheel, "bin": venv / "bin", "python": python, "env": env, "base": base}


def test_the_wheel_ships_the_commands_configs_and_slurm_templates(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for name in ("pipeline/commands/pretrain.py", "pipeline/shipped_configs/tiny.json",
                 "pipeline/shipped_configs/glue/custom.json", "pipeline/shipped_configs/tasks/ner.json",
                 "pipeline/shipped_configs/shard/example.json", "pipeline/slurm/pretrain.sbatch"):
        assert name in names, name
    shipped = {n.removeprefix("pipeline/shipped_configs/") for n in names if n.startswith("pipeline/shipped_configs/")}
    in_checkout = {str(p.relative_to(ROOT / "configs")) for p in (ROOT / "configs").rglob("*.json")}
    assert in_checkout <= shipped, sorted(in_checkout - shipped)


def test_installed_commands_run_every_stage_from_outside_the_checkout(installed, tmp_path):
    bin_, env, work = installed["bin"], installed["env"], tmp_path
    where = run([str(installed["python"]), "-c", "import pipeline; print(pipeline.__file__)"], work, env)
    assert str(installed["base"] / "venv") in where and str(ROOT) not in where, where

    corpus = write_jsonl(work / "corpus.jsonl", make_documents(300))
    run([str(bin_ / "roberta-train-tokenizer"), "--input", str(corpus), "--type", "bpe", "--vocab-size", "400",
         "--min-frequency", "1", "--out", "tok"], work, env)
    run([str(bin_ / "roberta-shard"), "--input", str(corpus), "--tokenizer", "tok", "--seq-len", "32",
         "--val-fraction", "0.1", "--workers", "1", "--out", "shards"], work, env)
    assert "OK" in run([str(bin_ / "roberta-verify-shards"), "shards"], work, env)

    sets = {"model.num_hidden_layers": 2, "model.hidden_size": 32, "model.num_attention_heads": 2,
            "model.intermediate_size": 64, "data.shards": "shards",
            "data.tokenizer": "tok", "data.num_workers": 0, "train.output_dir": "pretrain", "train.max_steps": 3,
            "train.global_batch_size": 8, "train.micro_batch_size": 8, "train.eval_every": 3,
            "train.eval_sequences": 8, "schedule.warmup_steps": 1, "checkpoint.every": 3, "tracking.enabled": "false",
            "train.zero_stage": 0}
    overrides = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    run([str(bin_ / "roberta-pretrain"), "--config", "tiny", *overrides], work, env)
    run([str(bin_ / "roberta-export"), "pretrain", "--out", "export"], work, env)
    assert (work / "export" / "config.json").is_file()

    rows = [json.dumps({"text": text, "label": "long" if len(text) > 300 else "short"}) + "\n"
            for text in make_documents(24)]
    (work / "task").mkdir()
    (work / "task" / "train.jsonl").write_text("".join(rows[:16]))
    (work / "task" / "dev.jsonl").write_text("".join(rows[16:]))
    out = run([str(bin_ / "roberta-finetune"), "--config", "custom", "--model", "export",
               "--set", "data.train_file=task/train.jsonl", "--set", "data.validation_file=task/dev.jsonl",
               "--set", "data.max_seq_len=32", "--set", "train.output_dir=finetune", "--set", "train.epochs=1",
               "--set", "train.batch_size=8", "--set", "tracking.enabled=false"], work, env)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["task"] == "custom" and (work / "finetune" / "seed_1" / "complete.json").is_file(), out


def test_a_config_name_the_wheel_does_not_ship_is_refused_with_the_shipped_names(installed, tmp_path):
    proc = subprocess.run([str(installed["bin"] / "roberta-pretrain"), "--config", "no-such-config",
                           "--print-config"], cwd=tmp_path, env=installed["env"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "no shipped pretrain config" in proc.stderr and "tiny" in proc.stderr, proc.stderr
