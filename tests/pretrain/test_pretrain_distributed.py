"""Pretraining under the real launchers: 2 CPU ranks on gloo, as on a GPU node but slower.

Each launch costs ~15 s of start-up, so every launch here checks several things.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
from helpers import PYTHON, ROOT, probe_files, tiny_pretrain_config

from pipeline.common.processes.topology import free_port
from pipeline.common.run_layout import PretrainLayout

pytestmark = pytest.mark.slow  # every test shares a deepspeed/torchrun launch of 2 ranks

DIST_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1"}
DEEPSPEED = [str(Path(PYTHON).parent / "deepspeed"), "--num_gpus", "2", "--master_port"]
TORCHRUN = [str(Path(PYTHON).parent / "torchrun"), "--nproc_per_node", "2", "--master_port"]


def launch(prefix: list[str], script: str, *args, wait: bool = True, timeout: float = 300):
    """Start `script` under a launcher prefix ([] for plain python); return the finished or running process."""
    cmd = [*prefix, str(free_port()), script, *map(str, args)] if prefix else [PYTHON, script, *map(str, args)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=DIST_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not wait:
        return proc
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-6000:]}"
    return out


def step_losses(output_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in PretrainLayout(output_dir).metrics.read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}


def write_config(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def zero_stage_runs(tmp_path_factory, roberta_shards, bpe_tokenizer_dir):
    """The same 8-step fp32 run as 1 rank × accumulation 4 and 2 ranks × accumulation 2, for ZeRO 0–3."""
    root = tmp_path_factory.mktemp("zero")
    config = write_config(root / "config.json", tiny_pretrain_config(
        roberta_shards, bpe_tokenizer_dir, root / "unused", data={"num_workers": 1, "cache_dir": str(root / "cache")},
        checkpoint={"every": 4, "keep_last": 1}))
    harness = "tests/dist/train_each_zero_stage.py"
    launch([], harness, config, root / "one_rank")
    launch(DEEPSPEED, harness, config, root / "two_ranks")
    return root


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_two_ranks_match_one_rank_with_twice_the_accumulation(zero_stage_runs, stage):
    one = step_losses(zero_stage_runs / "one_rank" / f"zero{stage}")
    two = step_losses(zero_stage_runs / "two_ranks" / f"zero{stage}")
    assert sorted(one) == sorted(two) == list(range(1, 9))
    # fp32; only the order of the gradient sums differs. Measured: below 1e-6.
    assert max(abs(one[s] - two[s]) for s in one) < 1e-5
    assert one[8] < one[1]


def test_exports_from_every_zero_stage_hold_the_same_weights(zero_stage_runs):
    from transformers import AutoModelForMaskedLM

    reference_run = PretrainLayout(zero_stage_runs / "one_rank" / "zero0")
    reference = AutoModelForMaskedLM.from_pretrained(reference_run.export).state_dict()
    for layout in ("one_rank", "two_ranks"):
        for stage in (0, 1, 2, 3):
            folder = zero_stage_runs / layout / f"zero{stage}"
            weights = AutoModelForMaskedLM.from_pretrained(PretrainLayout(folder).export).state_dict()
            assert weights.keys() == reference.keys()
            worst = max((weights[k] - reference[k]).abs().max().item() for k in reference)
            assert worst < 1e-4, f"{layout} ZeRO {stage}: export differs by {worst}"
            # keep_last=1: only the final checkpoint survives.
            assert [p.name for p in PretrainLayout(folder).checkpoints.glob("step_*")] == ["step_00000008"]


@pytest.fixture(scope="module")
def tracked_runs(tmp_path_factory, roberta_shards, bpe_tokenizer_dir, documents):
    """A bf16 ZeRO-2 run under `deepspeed` with MLflow; the same run stopped by SIGUSR1, resumed under torchrun."""
    root = tmp_path_factory.mktemp("tracked")
    uri = f"sqlite:///{root / 'mlflow.db'}"

    def config(name: str, **probes) -> Path:
        return write_config(root / f"{name}.json", tiny_pretrain_config(
            roberta_shards, bpe_tokenizer_dir, root / name,
            data={"num_workers": 1, "cache_dir": str(root / "cache")},
            train={"max_steps": 40, "eval_every": 10, "zero_stage": 2, "precision": "bf16"},
            checkpoint={"every": 10, "keep_last": 2},
            tracking={"enabled": True, "uri": uri, "experiment": "tests", "flush_seconds": 0.5}, probes=probes))

    # The full run probes at each evaluation; the stopped one does not, and its losses equal the full run's.
    full_log = launch(DEEPSPEED, "launchers/pretrain.py", "--config", config("full", cloze_texts=16,
                                                                              **probe_files(root, documents)))

    stopped = launch(DEEPSPEED, "launchers/pretrain.py", "--config", config("stopped"), wait=False)
    metrics = PretrainLayout(root / "stopped").metrics
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(step_losses(root / "stopped")) >= 3):
        assert stopped.poll() is None and time.monotonic() < deadline, stopped.stdout.read()
        time.sleep(0.05)
    workers = [p for p in psutil.Process(stopped.pid).children(recursive=True)
               if any(a.startswith("--local_rank") for a in p.cmdline()) and p.name() != "pt_data_worker"]
    assert len(workers) == 2
    for worker in workers:  # as SLURM signals every task of a job step
        worker.send_signal(signal.SIGUSR1)
    stop_log, _ = stopped.communicate(timeout=120)
    assert stopped.returncode == 0, stop_log[-4000:]
    stopped_at = max(step_losses(root / "stopped"))
    resume_log = launch(TORCHRUN, "launchers/pretrain.py", "--config", root / "stopped.json")
    return {"root": root, "uri": uri, "full_log": full_log, "stop_log": stop_log, "resume_log": resume_log,
            "stopped_at": stopped_at}


def test_tiny_config_trains_and_the_loss_falls(tracked_runs):
    losses = step_losses(tracked_runs["root"] / "full")
    assert list(losses) == list(range(1, 41))
    first, last = sum(losses[s] for s in (1, 2, 3)) / 3, sum(losses[s] for s in (38, 39, 40)) / 3
    assert last < first - 0.5, (first, last)
    records = [json.loads(x) for x in PretrainLayout(tracked_runs["root"] / "full").metrics.read_text().splitlines()]
    evals = [r for r in records if "eval/mlm_loss" in r]
    assert [r["step"] for r in evals] == [10, 20, 30, 40] and evals[-1]["eval/mlm_loss"] < evals[0]["eval/mlm_loss"]
    step = next(r for r in records if r.get("step") == 5 and "train/loss" in r)
    assert {"train/lr", "train/grad_norm", "train/loss_scale", "train/tokens_per_s", "train/samples_per_s"} <= set(step)
    kept = sorted(p.name for p in PretrainLayout(tracked_runs["root"] / "full").checkpoints.glob("step_*"))
    assert kept == ["step_00000030", "step_00000040"]


def test_each_evaluation_probes_the_live_model_into_metrics_and_mlflow_curves(tracked_runs):
    from mlflow.tracking import MlflowClient

    layout = PretrainLayout(tracked_runs["root"] / "full")
    evals = [r for r in map(json.loads, layout.metrics.read_text().splitlines()) if "eval/mlm_loss" in r]
    names = ("probe/cloze/top1", "probe/cloze/constant", "probe/minimal_pairs/minimal_pairs",
             "probe/retrieval/retrieval/ndcg_at_10", "probe/retrieval/retrieval/bm25/ndcg_at_10",
             "probe/sts/sts/spearman")
    for record in evals:
        assert all(0 <= record[name] <= 1 for name in names[:-1]) and -1 <= record[names[-1]] <= 1, record
    assert "step 40: probes: cloze top-1 " in tracked_runs["full_log"]
    client = MlflowClient(tracked_runs["uri"])
    run_id = json.loads(layout.tracking.read_text())["run_id"]
    for name in names:
        assert sorted(m.step for m in client.get_metric_history(run_id, name)) == [10, 20, 30, 40], name


def test_a_run_stopped_by_sigusr1_checkpoints_and_resumes_to_the_same_losses(tracked_runs):
    root, stopped_at = tracked_runs["root"], tracked_runs["stopped_at"]
    assert 3 <= stopped_at < 40 and f"stopped by SIGUSR1 after step {stopped_at}" in tracked_runs["stop_log"]
    assert f"resumed from {root / 'stopped' / 'checkpoints' / f'step_{stopped_at:08d}'}" in tracked_runs["resume_log"]
    full, resumed = step_losses(root / "full"), step_losses(root / "stopped")
    assert sorted(resumed) == list(range(1, 41))
    # Same data order, masks and dropout after the resume, and the full run's probes changed nothing; bf16 ZeRO-2
    # restores exactly. Measured: 0.
    assert max(abs(full[s] - resumed[s]) for s in full) < 1e-6


def test_mlflow_holds_params_tags_per_step_loss_and_the_export(tracked_runs):
    from mlflow.tracking import MlflowClient

    root = tracked_runs["root"]
    client = MlflowClient(tracked_runs["uri"])
    run = client.get_run(json.loads(PretrainLayout(root / "full").tracking.read_text())["run_id"])
    assert run.data.params["train.global_batch_size"] == "16" and run.data.params["model.hidden_size"] == "64"
    assert run.data.params["train.zero_stage"] == "2"
    tags = run.data.tags
    assert tags["world_size"] == "2" and tags["deepspeed_version"] and tags["torch_version"] == torch.__version__
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(1, 41))
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "export"} <= artifacts and run.info.status == "FINISHED"
    # The stopped-and-resumed run went on logging into one MLflow run, each step once.
    resumed = json.loads(PretrainLayout(root / "stopped").tracking.read_text())["run_id"]
    steps = sorted(m.step for m in client.get_metric_history(resumed, "train/loss"))
    assert steps == list(range(1, 41)) and client.get_run(resumed).info.status == "FINISHED"


def test_the_export_loads_in_transformers_and_fills_masks(tracked_runs, tmp_path):
    from transformers import AutoModelForMaskedLM, pipeline

    export = PretrainLayout(tracked_runs["root"] / "full").export
    model = AutoModelForMaskedLM.from_pretrained(export)
    assert type(model).__name__ == "RobertaForMaskedLM"
    predictions = pipeline("fill-mask", model=str(export))("the <mask> encoder")
    assert len(predictions) == 5 and all("token_str" in p for p in predictions)
    # Proven: the bf16 run's fp32 master weights (sparse head, 2 ranks' ZeRO-2 weights) through the training class
    # against the fp32 export, both in fp32: the same numbers by two code paths, so fp32's tolerance and the same
    # top tokens (40 steps leave near-ties, which only a rounding difference of bf16's size would flip).
    check = json.loads((export / "pipeline_export.json").read_text())["equivalence"]
    assert check["within_tolerance"] and check["precision"] == "fp32"
    assert "bf16 run's fp32 weights" in check["reference"]
    assert check["top1_agreement"] > 0.95, check
    from huggingface_hub import ModelCard

    card = ModelCard.load(export / "README.md")
    assert card.data.pipeline_tag == "fill-mask" and "| validation MLM loss at 15% masking (step 40) | " in card.text
    assert "| tokens seen | 40,960 (sequence positions, padding included) |" in card.text  # 40 steps × 16 × 64
    # The export command gives the same weights from the output folder, and refuses to overwrite.
    out = tmp_path / "again"
    proc = subprocess.run([PYTHON, "launchers/export.py", str(tracked_runs["root"] / "full"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, env=DIST_ENV)
    assert proc.returncode == 0, proc.stderr
    again = AutoModelForMaskedLM.from_pretrained(out).state_dict()
    assert all(torch.equal(again[k], v) for k, v in model.state_dict().items())
    proc = subprocess.run([PYTHON, "launchers/export.py", str(tracked_runs["root"] / "full"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, env=DIST_ENV)
    assert proc.returncode == 2 and "exists and is not empty" in proc.stderr


def test_bert_under_plain_python_trains_with_mlflow_unreachable(tmp_path, pairs_shards, wordpiece_tokenizer_dir):
    """One process, no launcher; MLM + NSP on pairs shards; a tracking server that is not there."""
    from transformers import BertForPreTraining

    config = write_config(tmp_path / "bert.json", tiny_pretrain_config(
        pairs_shards, wordpiece_tokenizer_dir, tmp_path / "bert", model={"architecture": "bert"},
        train={"max_steps": 6}, checkpoint={"every": 3},
        tracking={"enabled": True, "uri": "http://127.0.0.1:9", "experiment": "unreachable"}))
    log = launch([], "launchers/pretrain.py", "--config", config)
    assert "MLflow tracking at http://127.0.0.1:9 is off for this run" in log
    records = [json.loads(x) for x in PretrainLayout(tmp_path / "bert").metrics.read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 7))
    assert all(abs(r["train/loss"] - r["train/mlm_loss"] - r["train/nsp_loss"]) < 1e-4 for r in steps)
    model = BertForPreTraining.from_pretrained(PretrainLayout(tmp_path / "bert").export)
    assert model.config.type_vocab_size == 2
