"""Faults during pretraining: kill -9, a kill while saving, a second run on a live run's folder, a corrupt shard, a
NaN loss."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import PYTHON, ROOT, holder_process, tiny_pretrain_config

from pipeline.common.processes.topology import free_port
from pipeline.common.run_layout import PretrainLayout

pytestmark = pytest.mark.slow  # every test runs pretraining end to end in its own processes

ENV = {**os.environ, "DS_ACCELERATOR": "cpu"}  # one OpenMP thread, as tests/conftest.py sets


def start(config: Path) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "launchers/pretrain.py", "--config", str(config)], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(config: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "launchers/pretrain.py", "--config", str(config), *extra], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)


def losses(output_dir: Path) -> list[tuple[int, float]]:
    lines = PretrainLayout(output_dir).metrics.read_text().splitlines()
    return [(r["step"], r["train/loss"]) for r in map(json.loads, lines) if "train/loss" in r]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, roberta_shards, bpe_tokenizer_dir):
    """An uninterrupted 12-step run, and the same run SIGKILLed after step 6 (checkpoints every 4), resumed."""
    root = tmp_path_factory.mktemp("faults")
    configs = {}
    for name in ("full", "killed"):
        data = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, root / name, train={"max_steps": 12},
                                    data={"num_workers": 1, "cache_dir": str(root / "cache")})
        configs[name] = root / f"{name}.json"
        configs[name].write_text(json.dumps(data))
    assert finish(configs["full"]).returncode == 0
    proc = start(configs["killed"])
    deadline = time.monotonic() + 180
    while not (PretrainLayout(root / "killed").metrics.exists() and len(losses(root / "killed")) >= 6):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its DataLoader workers, with no chance to save
    proc.wait()
    killed_at = len(losses(root / "killed"))
    resumed = finish(configs["killed"])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    return {"root": root, "configs": configs, "killed_at": killed_at, "resume_log": resumed.stdout + resumed.stderr,
            "killed_pid": proc.pid}


def test_kill_9_then_resume_repeats_the_uninterrupted_trajectory(interrupted):
    root = interrupted["root"]
    assert 6 <= interrupted["killed_at"] < 12
    resumed_from = re.search(r"resumed from \S+/step_(\d+) ", interrupted["resume_log"])
    assert resumed_from and int(resumed_from.group(1)) in (4, 8)  # the newest checkpoint before the kill
    full, killed = losses(root / "full"), losses(root / "killed")
    # Each step exactly once (no batch repeated or skipped) and the same losses, bit for bit.
    assert [s for s, _ in killed] == list(range(1, 13))
    assert killed == full
    # The killed run's lock named a dead process: taken over, and the ledger says from whom.
    from pipeline.pretrain.checkpoints.ledger import LockTakenOverEvent, read_ledger

    taken = [e for e in read_ledger(PretrainLayout(root / "killed").ledger).events if isinstance(e, LockTakenOverEvent)]
    assert len(taken) == 1 and taken[0].holder.startswith(f"pid {interrupted['killed_pid']} on ")
    assert not (root / "killed" / "run.lock").exists()  # released at the end


def test_a_second_run_on_a_live_runs_folder_is_refused_before_it_writes_anything(tmp_path, roberta_shards,
                                                                                  bpe_tokenizer_dir):
    config = tmp_path / "c.json"
    config.write_text(json.dumps(tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "run")))
    holder = holder_process(tmp_path / "run", SLURM_JOB_ID="77")  # a live run (a requeue's old job, say)
    try:
        refused = finish(config)
    finally:
        holder.kill()
        holder.wait()
    assert refused.returncode == 2
    assert re.search(rf"another run holds this run folder: pid {holder.pid} on \S+, SLURM job 77", refused.stderr)
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["run.lock"]  # no config, ledger, metrics or checkpoint


def test_the_flag_that_accepts_an_unlocked_folder_sets_its_config_key_and_the_checkpointer_passes_it_on(tmp_path):
    from pipeline.commands import pretrain as launcher
    from pipeline.common.processes.topology import Topology
    from pipeline.pretrain.checkpointer import Checkpointer
    from pipeline.pretrain.config import DataConfig, PretrainConfig, TrainConfig

    assert launcher.overrides(launcher.parse_args(["--config", "c.json", "--allow-unlocked-folder"])) == [
        "train.allow_unlocked_folder=true"]
    for allowed in (False, True):
        config = PretrainConfig(data=DataConfig(shards="s", tokenizer="t"),
                                train=TrainConfig(output_dir=str(tmp_path), allow_unlocked_folder=allowed))
        assert Checkpointer(config, Topology(0, 0, 1, False), None).allow_unlocked is allowed


def test_a_checkpoint_cut_short_while_saving_is_never_resumed_from(interrupted, tmp_path):
    root, config = interrupted["root"], interrupted["configs"]["killed"]
    checkpoints = PretrainLayout(root / "killed").checkpoints
    half_written = checkpoints / "step_00000016"
    shutil.copytree(checkpoints / "step_00000012", half_written)
    (half_written / "complete.json").unlink()  # the marker is the last thing a save writes
    for f in half_written.glob("*.pt"):
        f.write_bytes(f.read_bytes()[:100])
    proc = finish(config, "--set", "train.max_steps=14")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from" in proc.stderr + proc.stdout and "step_00000012 (step 12)" in proc.stderr + proc.stdout
    assert [s for s, _ in losses(root / "killed")] == list(range(1, 15))
    assert (checkpoints / "step_00000014" / "complete.json").exists() and not half_written.exists()


def test_a_nan_loss_stops_with_a_message_naming_the_last_good_checkpoint(tmp_path, roberta_shards, bpe_tokenizer_dir):
    data = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "nan", optimizer={"lr": 1e12},
                                train={"max_steps": 30, "gradient_clipping": 0.0}, schedule={"warmup_steps": 0},
                                checkpoint={"every": 1})
    (tmp_path / "nan.json").write_text(json.dumps(data))
    proc = finish(tmp_path / "nan.json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert re.search(r"the training loss is (nan|inf) at step \d+", proc.stderr), proc.stderr[-2000:]
    assert "The last good checkpoint is" in proc.stderr and "step_000000" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_corrupt_shard_stops_the_run_naming_the_shard(tmp_path, roberta_shards, bpe_tokenizer_dir):
    shards = tmp_path / "shards"
    shutil.copytree(roberta_shards, shards)
    index = json.loads((shards / "index.json").read_text())
    bad = shards / index["splits"]["train"]["shards"][2]["file"]
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    data = tiny_pretrain_config(shards, bpe_tokenizer_dir, tmp_path / "out")
    (tmp_path / "c.json").write_text(json.dumps(data))
    proc = finish(tmp_path / "c.json")
    assert proc.returncode == 2 and f"shard {bad} is corrupt or truncated" in proc.stderr, proc.stderr[-2000:]


DEEPSPEED = [str(Path(PYTHON).parent / "deepspeed"), "--num_gpus", "2", "--master_port"]


def run_until_killed(cmd: list[str], output_dir: Path, after_step: int) -> None:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    while not (PretrainLayout(output_dir).metrics.exists() and len(losses(output_dir)) >= after_step):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# A batch warmup of 7 steps at global batch 8 (7 × 8 sequences of 64 tokens), then 16: the checkpoint at
# step 6 is inside it, and the resumed run hands over to the full batch.
BATCH_WARMUP = {"batch_warmup_tokens": 7 * 8 * 64, "batch_warmup_start": 8}


def elastic_config(folder: Path, name: str, roberta_shards: Path, bpe_tokenizer_dir: Path, warmup: dict) -> Path:
    """ZeRO-2, 10 steps, a checkpoint at step 6."""
    data = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, folder / name,
                                train={"max_steps": 10, "zero_stage": 2, **warmup},
                                checkpoint={"every": 6}, data={"cache_dir": str(folder / "cache")})
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def pretrain_command(ranks: int, path: Path) -> list[str]:
    prefix = [*DEEPSPEED, str(free_port())] if ranks == 2 else [PYTHON]
    return [*prefix, "launchers/pretrain.py", "--config", str(path)]


@pytest.fixture(scope="module")
def uninterrupted_losses(tmp_path_factory, roberta_shards, bpe_tokenizer_dir):
    """The losses of the elastic runs' config on 1 rank, uninterrupted: one launch per batch warmup, shared."""
    found: dict[str, list[tuple[int, float]]] = {}

    def reference(warmup: dict) -> list[tuple[int, float]]:
        key = json.dumps(warmup, sort_keys=True)
        if key not in found:
            folder = tmp_path_factory.mktemp("reference")
            config = elastic_config(folder, "reference", roberta_shards, bpe_tokenizer_dir, warmup)
            proc = subprocess.run(pretrain_command(1, config), cwd=ROOT, env=ENV, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr[-2000:]
            found[key] = losses(folder / "reference")
        return found[key]

    return reference


@pytest.mark.parametrize("first,then,warmup", [(2, 1, {}), (1, 2, {}), (2, 1, BATCH_WARMUP)],
                         ids=["2-ranks-then-1", "1-rank-then-2", "2-ranks-then-1-in-a-batch-warmup"])
def test_elastic_resume_keeps_the_global_batch_and_data_order(tmp_path, roberta_shards, bpe_tokenizer_dir, first,
                                                              then, warmup, uninterrupted_losses):
    """ZeRO-2, killed after step 7 (checkpoint at 6), resumed on the other number of ranks."""
    elastic = elastic_config(tmp_path, "elastic", roberta_shards, bpe_tokenizer_dir, warmup)
    run_until_killed(pretrain_command(first, elastic), tmp_path / "elastic", after_step=7)
    resumed = subprocess.run(pretrain_command(then, elastic), cwd=ROOT, env=ENV,
                             capture_output=True, text=True, timeout=300)
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-3000:]
    assert f"written by {first} ranks, this run has {then}: converting it to a universal checkpoint" in log
    expected, got = uninterrupted_losses(warmup), losses(tmp_path / "elastic")
    assert [s for s, _ in got] == list(range(1, 11))
    # Same sequences in every step; only the order of floating-point sums differs between layouts.
    assert max(abs(a - b) for (_, a), (_, b) in zip(expected, got, strict=True)) < 1e-4
    if warmup:  # the resumed run handed over to the full batch after the 7 warmup steps
        records = [json.loads(line) for line in PretrainLayout(tmp_path / "elastic").metrics.read_text().splitlines()]
        assert [r["step"] for r in records if r.get("global_batch_size") == 16] == [7]
