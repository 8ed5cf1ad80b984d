"""SLURM jobs on a real cluster that the suite stands up itself (root and Debian's packages needed).

Two slurmd "nodes" on this machine: the pretraining job spans both (one torchrun per node,
started by srun), is preempted with `scancel --signal=USR1 --batch`, requeues itself and finishes
with the losses of an uninterrupted run. Select these tests with `pytest -m slurm`; the tests
without that marker need no cluster.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from helpers import PYTHON, ROOT, run_script, tiny_pretrain_config, write_jsonl

from pipeline.common.run_layout import PretrainLayout

SETUP = ROOT / "tests" / "slurm" / "setup.sh"
INSTALL = ROOT / "tests" / "slurm" / "install.sh"


def slurm_unavailable_reason() -> str | None:
    """Why no cluster can be stood up on this machine, or None when one can."""
    if os.geteuid() != 0:
        return "standing up a SLURM cluster needs root"
    if not shutil.which("apt-get") or not shutil.which("dpkg"):
        return "standing up a SLURM cluster needs Debian's apt-get"
    # Installing them would reach the package registry, which no test does (launchers/test.sh installs them first).
    missing = subprocess.run(["bash", str(INSTALL), "--check"], capture_output=True, text=True)
    if missing.returncode != 0:
        return f"SLURM's packages are {missing.stderr.strip()} (`bash {INSTALL.relative_to(ROOT)}` installs them)"
    return None


def stand_up_cluster(setup: Path, base: Path) -> dict[str, str]:
    """Run the set-up script; skip where no cluster can start here, fail where one could but set-up broke."""
    reason = slurm_unavailable_reason()
    if reason:
        pytest.skip(reason)
    env = {**os.environ, "BASE": str(base), "NODES": "2", "PORT_BASE": str(18000 + os.getpid() % 500 * 4)}
    proc = subprocess.run(["bash", str(setup)], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"a SLURM cluster can start here (root, apt-get), but {setup.name} failed "
                    f"(exit {proc.returncode}): {(proc.stderr or proc.stdout)[-500:]}", pytrace=False)
    env["SLURM_CONF"] = str(base / "etc" / "slurm.conf")
    return env


@pytest.fixture(scope="module")
def slurm():
    """A running 2-node cluster; yields the environment its client commands need."""
    base = Path(tempfile.mkdtemp(prefix="pipeline-slurm-"))  # munge needs an a+x path to its socket
    base.chmod(0o755)
    try:
        env = stand_up_cluster(SETUP, base)
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    yield env
    subprocess.run(["bash", str(ROOT / "tests" / "slurm" / "teardown.sh")], env=env, timeout=60)
    shutil.rmtree(base, ignore_errors=True)


def test_slurm_set_up_that_breaks_where_a_cluster_can_start_is_a_failure_not_a_skip(tmp_path, monkeypatch):
    broken = tmp_path / "setup.sh"
    broken.write_text("echo 'slurmctld: fatal: cannot bind port' >&2; exit 3\n")
    monkeypatch.setattr(sys.modules[__name__], "slurm_unavailable_reason", lambda: None)
    with pytest.raises(pytest.fail.Exception, match="can start here .*setup.sh failed \\(exit 3\\).*cannot bind"):
        stand_up_cluster(broken, tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "slurm_unavailable_reason", lambda: "needs root")
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        stand_up_cluster(broken, tmp_path)


def test_slurm_unavailable_reason_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs root" in slurm_unavailable_reason()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)
    checked = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: checked.append(cmd) or subprocess.CompletedProcess(
        cmd, 1, "", "not installed: slurmd munge\n"))
    assert slurm_unavailable_reason() == ("SLURM's packages are not installed: slurmd munge "
                                          "(`bash tests/slurm/install.sh` installs them)")
    assert checked == [["bash", str(INSTALL), "--check"]]  # checks, never installs
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "apt-get" in slurm_unavailable_reason()


def test_the_install_check_names_the_missing_packages_and_installs_nothing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dpkg").write_text('#!/bin/bash\n[ "$2" != munge ]\n')  # `dpkg -s PKG`: only munge is missing
    (bin_dir / "apt-get").write_text(f'#!/bin/bash\necho "$@" >> {tmp_path / "apt-get.log"}\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    check = subprocess.run(["bash", str(INSTALL), "--check"], env=env, capture_output=True, text=True)
    assert check.returncode == 1 and check.stderr.strip() == "not installed: munge"
    assert not (tmp_path / "apt-get.log").exists()
    install = subprocess.run(["bash", str(INSTALL)], env=env, capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    assert (tmp_path / "apt-get.log").read_text().splitlines()[-1].endswith("--no-install-recommends munge")


def submit(env, *args) -> list[str]:
    proc = subprocess.run([PYTHON, "launchers/submit.py", *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def wait_for(env, job: str, timeout: float = 400) -> dict[str, str]:
    """Wait until the job leaves the queue; return its `scontrol show job` fields."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queue = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True)
        if not queue.stdout.strip():
            break
        time.sleep(1)
    else:
        subprocess.run(["scancel", job], env=env)
        raise AssertionError(f"job {job} still queued after {timeout} s")
    shown = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
    return dict(field.split("=", 1) for field in shown.split() if "=" in field)


def test_slurm_dry_run_renders_requeue_signal_and_one_launcher_per_node(tmp_path, roberta_shards, bpe_tokenizer_dir):
    config = tmp_path / "c.json"
    config.write_text(json.dumps(tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "out")))
    proc = run_script("launchers/submit.py", "pretrain", "--config", config, "--nodes", "4", "--gpus-per-node", "8",
                      "--time", "24:00:00", "--partition", "gpu", "--account", "lab", "--set", "train.max_steps=9",
                      "--set", "train.global_batch_size=256",
                      "--no-check-files", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    for line in ("#SBATCH --nodes=4", "#SBATCH --gpus-per-node=8", "#SBATCH --partition=gpu", "#SBATCH --account=lab",
                 "#SBATCH --requeue", "#SBATCH --signal=B:USR1@300", "scontrol requeue",
                 "srun --ntasks-per-node=1", "node_launch.sh 8", "--set train.max_steps=9"):
        assert line in script, line
    bad = run_script("launchers/submit.py", "pretrain", "--config", config, "--nodes", "3", "--gpus-per-node", "8",
                     "--dry-run")  # global batch 16 over 24 ranks
    assert bad.returncode == 2 and "not divisible" in bad.stderr


def test_slurm_dry_run_of_a_shard_config_renders_its_flags_and_checks_them(tmp_path):
    config = tmp_path / "shard.json"
    config.write_text(json.dumps({"input": ["a.jsonl", "b dir/"], "tokenizer": "tok", "seq_len": 64,
                                  "out": str(tmp_path / "shards"), "val_fraction": 0.1, "one_doc_per_line": True}))
    proc = run_script("launchers/submit.py", "shard", "--config", config, "--parts", 3, "--dry-run",
                      "--set", "shard_size=50")
    assert proc.returncode == 0, proc.stderr
    for line in ("#SBATCH --array=0-2", "--input a.jsonl 'b dir/' --tokenizer tok --seq-len 64",
                 "--val-fraction 0.1 --one-doc-per-line --shard-size 50",
                 '--rank "$SLURM_ARRAY_TASK_ID" --world-size 3', "--combine --world-size 3",
                 "python -m pipeline.commands.verify_shards"):
        assert line in proc.stdout, line
    dedup = run_script("launchers/submit.py", "shard", "--config", config, "--parts", 3, "--dry-run",
                       "--set", "dedup=exact")
    assert dedup.returncode == 0, dedup.stderr
    hashes, array = dedup.stdout.split("#!/usr/bin/env bash")[1:3]
    assert "--dedup exact" in hashes and "--dedup-hashes-only" in hashes and "#SBATCH --array=0-2" in hashes
    assert "--dedup exact" in array and "--dedup-hashes-only" not in array
    config.write_text(json.dumps({"input": ["a.jsonl"], "tokenizer": "tok", "seq_len": 4, "out": "s", "rank": 1}))
    bad = run_script("launchers/submit.py", "shard", "--config", config, "--dry-run")
    assert bad.returncode == 2 and "rank: not an option here" in bad.stderr
    config.write_text(json.dumps({"input": ["a.jsonl"], "tokenizer": "tok", "seq_len": 4, "out": "s"}))
    bad = run_script("launchers/submit.py", "shard", "--config", config, "--dry-run")
    assert bad.returncode == 2 and "--seq-len 4: must be at least 8" in bad.stderr


@pytest.mark.slow
@pytest.mark.slurm
def test_slurm_shard_array_job_then_combine(slurm, tmp_path, bpe_tokenizer_dir, documents):
    inputs = [write_jsonl(tmp_path / f"part{i}.jsonl", documents[i::2]) for i in range(2)]
    config = tmp_path / "shard.json"
    config.write_text(json.dumps({"input": [str(p) for p in inputs], "tokenizer": str(bpe_tokenizer_dir),
                                  "seq_len": 64, "out": str(tmp_path / "shards"), "val_fraction": 0.1,
                                  "shard_size": 50, "workers": 1}))
    array_job, combine_job = submit(slurm, "shard", "--config", config, "--parts", 2, "--time", "00:10:00")
    assert wait_for(slurm, array_job + "_0")["JobState"] == "COMPLETED"
    assert wait_for(slurm, combine_job)["JobState"] == "COMPLETED"
    index = json.loads((tmp_path / "shards" / "index.json").read_text())
    assert len(index["parts"]) == 2 and index["splits"]["train"]["sequences"] > 100


@pytest.fixture(scope="module")
def preempted_job(slurm, tmp_path_factory, roberta_shards, bpe_tokenizer_dir):
    root = tmp_path_factory.mktemp("slurm-pretrain")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    configs = {}
    # The reference is not tracked: it trains while the requeued job runs, and one SQLite store written by both
    # could answer "database is locked".
    for name, tracked in (("reference", False), ("preempted", True)):
        data = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, root / name,
                                    train={"max_steps": 40, "zero_stage": 2},
                                    checkpoint={"every": 100}, data={"cache_dir": str(root / "cache")},
                                    tracking={"enabled": tracked, "uri": uri, "experiment": "slurm"})
        configs[name] = root / f"{name}.json"
        configs[name].write_text(json.dumps(data))
    (job,) = submit(slurm, "pretrain", "--config", configs["preempted"], "--nodes", 2, "--procs-per-node", 1,
                    "--time", "00:20:00")
    metrics = PretrainLayout(root / "preempted").metrics
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().count("train/loss") >= 5):
        assert time.monotonic() < deadline, "the job did not start training"
        time.sleep(0.1)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=slurm, check=True)
    # The uninterrupted run trains meanwhile: SLURM holds a requeued job for ~10 s (its BeginTime) before it
    # starts again, time this fixture otherwise spent waiting.
    reference = subprocess.run([PYTHON, "launchers/pretrain.py", "--config", str(configs["reference"])], cwd=ROOT,
                               env={**os.environ, "DS_ACCELERATOR": "cpu"}, capture_output=True, text=True)
    assert reference.returncode == 0, reference.stderr[-2000:]
    fields = wait_for(slurm, job)
    log = "".join(p.read_text(errors="replace") for p in (root / "preempted" / "slurm").glob("*.out"))
    return {"root": root, "uri": uri, "fields": fields, "log": log}


def losses(folder: Path) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in map(json.loads, PretrainLayout(folder).metrics.read_text().splitlines())
            if "train/loss" in r}


@pytest.mark.slow
@pytest.mark.slurm
def test_slurm_pretrain_on_two_nodes_checkpoints_requeues_and_matches(preempted_job):
    fields, log = preempted_job["fields"], preempted_job["log"]
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", log[-3000:]
    assert "2 nodes × 1 processes" in log and "batch: checkpoint written; requeueing" in log
    assert "stopped by SIGUSR1 after step" in log and "resumed from" in log
    reference, preempted = losses(preempted_job["root"] / "reference"), losses(preempted_job["root"] / "preempted")
    assert sorted(preempted) == list(range(1, 41))
    # 2 ranks × 2 micro steps vs 1 rank × 4: the same sequences per step; only summation order differs.
    assert max(abs(reference[s] - preempted[s]) for s in reference) < 1e-4
    per_rank = list((preempted_job["root"] / "preempted" / "slurm").glob("job*-restart1-node1/**/stdout.log"))
    assert per_rank, "torchrun writes a log per rank"


@pytest.mark.slow
@pytest.mark.slurm
def test_slurm_requeued_job_keeps_logging_to_the_same_mlflow_run(preempted_job):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(preempted_job["uri"])
    experiment = client.get_experiment_by_name("slurm").experiment_id
    runs = [r for r in client.search_runs([experiment]) if r.info.run_name == "preempted"]
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "train/loss")]
    assert sorted(steps) == list(range(1, 41))


REQUEUES = {
    "requeue": "scontrol requeue of the running job: SLURM ends it (TERM, KILL after KillWait); the trainer saves",
    "kill-9-then-requeue": "the trainer SIGKILLed (it leaves its lock's name behind; the job fails), then scontrol "
                           "requeue of the failed job",
}


@pytest.fixture(scope="module", params=list(REQUEUES))
def requeued_job(request, slurm, tmp_path_factory, roberta_shards, bpe_tokenizer_dir):
    """A running pretraining job stopped as `REQUEUES` says; SLURM starts it again under the same id,
    `SLURM_RESTART_COUNT` 1, on the same run folder."""
    root = tmp_path_factory.mktemp("slurm-requeue")
    configs = {}
    for name in ("reference", "requeued"):
        data = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, root / name, train={"max_steps": 40},
                                    checkpoint={"every": 5, "keep_last": 2}, data={"cache_dir": str(root / "cache")})
        configs[name] = root / f"{name}.json"
        configs[name].write_text(json.dumps(data))
    env = {**slurm, "OMP_NUM_THREADS": "1"}  # the job inherits it: the reference's arithmetic, thread for thread
    (job,) = submit(env, "pretrain", "--config", configs["requeued"], "--nodes", 1, "--procs-per-node", 1,
                    "--time", "00:20:00")
    metrics = PretrainLayout(root / "requeued").metrics
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().count('"train/loss":') >= 12):  # past checkpoint 10
        assert time.monotonic() < deadline, "the job did not start training"
        time.sleep(0.1)
    requeued_after = metrics.read_text().count('"train/loss":')
    load = os.getloadavg()
    if request.param == "kill-9-then-requeue":
        # The trainer itself: `scancel --signal=KILL` reaches only the step's shell, and the trainer then gets TERM.
        (trainer,) = [p for p in psutil.process_iter() if _is_trainer_of(p, job)]
        trainer.kill()
        wait_for(env, job, timeout=120)
    subprocess.run(["scontrol", "requeue", job], env=env, check=True)
    reference = subprocess.run([PYTHON, "launchers/pretrain.py", "--config", str(configs["reference"])], cwd=ROOT,
                               env={**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"},
                               capture_output=True, text=True)
    assert reference.returncode == 0, reference.stderr[-2000:]
    fields = wait_for(env, job)
    log = "".join(p.read_text(errors="replace") for p in (root / "requeued" / "slurm").glob("*.out"))
    return {"root": root, "fields": fields, "log": log, "requeued_after": requeued_after, "load": load, "job": job,
            "how": request.param}


def _is_trainer_of(process: psutil.Process, job: str) -> bool:
    try:
        return ("pipeline.commands.pretrain" in " ".join(process.cmdline()) and "LOCAL_RANK" in process.environ()
                and process.environ().get("SLURM_JOB_ID") == job)
    except psutil.Error:
        return False


@pytest.mark.slow
@pytest.mark.slurm
def test_slurm_requeue_of_a_running_job_takes_the_folder_and_resumes_exactly(requeued_job):
    from pipeline.pretrain.checkpoints.ledger import LockTakenOverEvent, read_ledger

    root, fields, log = requeued_job["root"], requeued_job["fields"], requeued_job["log"]
    assert fields["JobState"] == "COMPLETED" and int(fields["Restarts"]) >= 1, log[-3000:]
    assert "another run holds this run folder" not in log and "resumed from" in log
    reference, requeued = losses(root / "reference"), losses(root / "requeued")
    assert sorted(requeued) == list(range(1, 41))
    taken = [e.holder for e in read_ledger(PretrainLayout(root / "requeued").ledger).events
             if isinstance(e, LockTakenOverEvent)]
    stopped = re.findall(r"stopped by SIG\w+ after step \d+|resumed from \S+ \(step \d+\)", log)
    print(f"{requeued_job['how']} after step {requeued_job['requeued_after']} (load {requeued_job['load']}): "
          f"{stopped}; lock taken over from {taken or 'nobody (released at the stop)'}; largest loss difference to "
          f"the uninterrupted run over steps 1-40: {max(abs(reference[s] - requeued[s]) for s in reference):.3g}")
    assert requeued == reference  # one process each, one thread each: the same arithmetic, step for step
    if requeued_job["how"] == "kill-9-then-requeue":  # the killed incarnation's lock was taken over, and said so
        assert len(taken) == 1 and f"SLURM job {requeued_job['job']} (since " in taken[0]
    assert not (root / "requeued" / "run.lock").exists()  # released at the end
