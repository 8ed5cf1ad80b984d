"""Fine-tuning end to end: a pretraining checkpoint exported once, a learnable task under `accelerate launch`,
seeds, saved models, MLflow, compare."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from helpers import PYTHON, ROOT, WORDS, predict_with_saved_model, run_script, tiny_pretrain_config

from pipeline.common.run_layout import PretrainLayout

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ACCELERATE = [str(Path(PYTHON).parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def keyword_examples(n: int, seed: int) -> list[dict]:
    """Six random words; the label says whether `river` is among them (balanced)."""
    rng = random.Random(seed)
    others = [w for w in WORDS if w != "river"]
    rows = []
    for i in range(n):
        words = [rng.choice(others) for _ in range(6)]
        if i % 2:
            words[rng.randrange(6)] = "river"
        rows.append({"text": " ".join(words), "label": "yes" if i % 2 else "no"})
    return rows


@pytest.fixture(scope="module")
def keyword_task(tmp_path_factory):
    """A custom task and its config; MLflow in the folder."""
    root = tmp_path_factory.mktemp("keyword")
    for name, n, seed in (("train", 400, 0), ("dev", 100, 1), ("test", 20, 2)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keyword_examples(n, seed)))
    uri = f"sqlite:///{root / 'mlflow.db'}"
    cfg = {"task": "custom",
           "data": {"train_file": str(root / "train.jsonl"), "validation_file": str(root / "dev.jsonl"),
                    "test_file": str(root / "test.jsonl"), "text_fields": ["text"], "label_field": "label",
                    "max_seq_len": 64},
           "train": {"output_dir": str(root / "ft"), "learning_rate": 1e-3, "batch_size": 16, "epochs": 4,
                     "warmup_ratio": 0.1},
           "tracking": {"enabled": True, "uri": uri, "experiment": "glue-tests"}}
    (root / "config.json").write_text(json.dumps(cfg))
    return {"root": root, "uri": uri}


@pytest.fixture(scope="module")
def pretrained(keyword_task, roberta_shards, bpe_tokenizer_dir):
    """A tiny pretraining run tracked in the task's MLflow store: 4 steps, one checkpoint, no export."""
    root, uri = keyword_task["root"], keyword_task["uri"]
    (root / "pretrain.json").write_text(json.dumps(tiny_pretrain_config(
        roberta_shards, bpe_tokenizer_dir, root / "pretrain", train={"max_steps": 4, "export": False},
        tracking={"enabled": True, "uri": uri, "experiment": "glue-tests", "run_name": "tiny-pretrain"})))
    proc = subprocess.run([PYTHON, "launchers/pretrain.py", "--config", str(root / "pretrain.json")], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keyword_task.update(checkpoint=PretrainLayout(root / "pretrain").checkpoints / "step_00000004",
                        pretrain_run_id=json.loads(PretrainLayout(root / "pretrain").tracking.read_text())["run_id"])
    return root / "pretrain"


@pytest.fixture(scope="module")
def two_process_run(keyword_task, pretrained):
    """Two seeds on 2 processes, started from the pretraining run folder (its newest checkpoint)."""
    root = keyword_task["root"]
    proc = subprocess.run([*ACCELERATE, "launchers/finetune.py", "--config", str(root / "config.json"),
                           "--model", str(pretrained), "--seeds", "1,2"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"report": json.loads((root / "ft" / "metrics.json").read_text()), "log": proc.stdout + proc.stderr}


@pytest.mark.slow  # accelerate launch of 2 processes
def test_learns_an_easy_task_to_high_accuracy_on_two_processes(two_process_run, keyword_task):
    report = two_process_run["report"]
    assert report["accuracy"] >= 0.95 and report["seeds"] == [1, 2]
    assert {"accuracy", "accuracy_mean", "accuracy_std", "f1_macro"} <= set(report)
    seed_dir = keyword_task["root"] / "ft" / "seed_2"
    per_seed = json.loads((seed_dir / "metrics.json").read_text())
    assert per_seed["processes"] == 2 and 1 <= per_seed["best_epoch"] <= 4
    lines = (seed_dir / "test_predictions.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 21
    assert {line.split("\t")[1] for line in lines[1:]} <= {"yes", "no"}
    assert (seed_dir / "confusion_dev.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # accelerate launch of 2 processes
def test_the_checkpoint_is_exported_once_by_rank_0(two_process_run, keyword_task):
    ft = keyword_task["root"] / "ft"
    exports = [line for line in two_process_run["log"].splitlines() if line.startswith("exported ")]
    assert exports == [f"exported {keyword_task['checkpoint']} to {ft / 'source_model'} (rank 0)"]
    provenance = json.loads((ft / "source_model" / "pipeline_export.json").read_text())
    assert provenance["checkpoint"] == str(keyword_task["checkpoint"])
    assert provenance["pretrain_run_id"] == keyword_task["pretrain_run_id"]
    assert not [p.name for p in ft.iterdir() if p.name.startswith(".")]  # no staging folder left behind


@pytest.mark.slow  # accelerate launch of 2 processes
def test_models_saved_on_two_processes_reproduce_their_dev_predictions(two_process_run, keyword_task):
    ft = keyword_task["root"] / "ft"
    best = json.loads((ft / "best_model.json").read_text())
    assert best["path"] == f"seed_{best['seed']}/model" and best["metric"] == "accuracy"
    assert best["value"] == max(r["accuracy"] for r in two_process_run["report"]["per_seed"])
    dev = [json.loads(line) for line in (keyword_task["root"] / "dev.jsonl").read_text().splitlines()]
    for seed in (1, 2):
        # Gathered from 2 processes during training; recomputed here in one, from the folder alone.
        model, predicted = predict_with_saved_model(ft / f"seed_{seed}" / "model", [r["text"] for r in dev], 64)
        rows = [line.split("\t") for line in (ft / f"seed_{seed}" / "dev_predictions.tsv").read_text().splitlines()]
        assert [p for _, p, _ in rows[1:]] == [model.config.id2label[int(p)] for p in predicted]
        accuracy = sum(p == r["label"] for (_, p, _), r in zip(rows[1:], dev, strict=True)) / len(dev)
        assert accuracy == json.loads((ft / f"seed_{seed}" / "complete.json").read_text())["metrics"]["accuracy"]


@pytest.mark.slow  # accelerate launch of 2 processes
def test_the_hub_interface_and_the_model_store_reproduce_the_saved_dev_accuracy(two_process_run, keyword_task):
    """The fine-tuning output loaded by its task name predicts the saved dev predictions; so does its MLflow model."""
    import mlflow.pyfunc
    from mlflow.tracking import MlflowClient

    from pipeline.hub import Encoder

    ft = keyword_task["root"] / "ft"
    best = json.loads((ft / "best_model.json").read_text())
    task = best["task"]
    enc = Encoder.from_pretrained(ft)
    assert list(enc.classification_heads) == [task]
    dev = [json.loads(line) for line in (keyword_task["root"] / "dev.jsonl").read_text().splitlines()]
    predicted = [enc.labels(task)[enc.predict(task, enc.encode(r["text"], max_length=64)).argmax().item()]
                 for r in dev]
    rows = [line.split("\t") for line in (ft / best["path"]).parent.joinpath("dev_predictions.tsv").read_text()
            .splitlines()[1:]]
    assert predicted == [p for _, p, _ in rows]
    assert sum(p == r["label"] for p, r in zip(predicted, dev, strict=True)) / len(dev) == best["value"]

    client = MlflowClient(keyword_task["uri"])
    experiment = client.get_experiment_by_name("glue-tests").experiment_id
    (run,) = client.search_runs([experiment], f"tags.stage = 'finetune' and tags.seed = '{best['seed']}'")
    assert {i.dataset.name for i in run.inputs.dataset_inputs} >= {f"{ft.parent.name}/train.jsonl",
                                                                    f"{ft.parent.name}/dev.jsonl"}
    mlflow.set_tracking_uri(keyword_task["uri"])
    assert mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model").predict([r["text"] for r in dev]) == \
        enc.classify(task, [r["text"] for r in dev])


@pytest.mark.slow  # accelerate launch of 2 processes
def test_mlflow_runs_link_to_the_pretraining_run_and_compare_joins_them(two_process_run, keyword_task, tmp_path):
    from mlflow.tracking import MlflowClient

    root = keyword_task["root"]
    scratch = run_script("launchers/finetune.py", "--config", root / "config.json", "--model",
                         root / "ft" / "source_model",
                         "--from-scratch", "--set", f"train.output_dir={root / 'scratch'}", "--set", "train.epochs=1")
    assert scratch.returncode == 0, scratch.stderr[-3000:]
    client = MlflowClient(keyword_task["uri"])
    runs = client.search_runs([client.get_experiment_by_name("glue-tests").experiment_id])
    seeds = [r for r in runs if r.data.tags.get("stage") == "finetune"]
    assert len(seeds) == 3 and all(r.data.tags["pretrain_run_id"] == keyword_task["pretrain_run_id"] for r in seeds)
    assert all(r.data.tags["pretrain_checkpoint"] == str(keyword_task["checkpoint"]) for r in seeds)
    assert sorted(r.data.tags["world_size"] for r in seeds) == ["1", "2", "2"]
    assert all(r.data.tags["git_commit"] and r.data.tags["transformers_version"] for r in seeds)
    epochs = client.get_metric_history(seeds[0].info.run_id, "eval/accuracy")
    assert sorted(m.step for m in epochs) in ([1, 2, 3, 4], [1])

    proc = run_script("launchers/compare.py", "--uri", keyword_task["uri"], "--experiment", "glue-tests",
                      "--out", tmp_path / "plots")
    assert proc.returncode == 0, proc.stderr
    header, _, row = proc.stdout.splitlines()[:3]
    assert "custom/accuracy (pretrained)" in header and "custom/accuracy (scratch)" in header
    assert row.startswith("tiny-pretrain") and "train/loss" in header
    assert (tmp_path / "plots" / "finetune_train_loss.png").exists()


@pytest.mark.slow  # three launches of the fine-tuning CLI, on the module's model fixture
def test_bad_inputs_stop_with_a_clear_error(keyword_task, tmp_path):
    root = keyword_task["root"]
    proc = run_script("launchers/finetune.py", "--config", root / "config.json", "--model", tmp_path / "nope")
    assert proc.returncode == 2 and "no such folder" in proc.stderr
    bad = json.loads((root / "config.json").read_text())
    bad["data"]["label_field"] = "stars"
    bad["train"]["epochs"] = 0
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    proc = run_script("launchers/finetune.py", "--config", tmp_path / "bad.json", "--model", tmp_path)
    assert proc.returncode == 2 and "train.epochs: must be ≥ 1" in proc.stderr
    proc = run_script("launchers/finetune.py", "--config", tmp_path / "bad.json", "--model", tmp_path,
                      "--set", "train.epochs=1")
    assert proc.returncode == 2 and "train.jsonl:1: no column 'stars'" in proc.stderr
