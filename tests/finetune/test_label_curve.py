"""The label-efficiency curve: the chosen setting retrained on N examples per class, reported on dev."""

from __future__ import annotations

import json

import pytest
from test_sweep import finetune, keyword_rows, tiny_model  # noqa: F401 (tiny_model: a fixture)

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.catalog import TaskSpec
from pipeline.data.tasks.splits import Split, TaskData
from pipeline.finetune.protocol.label_curve import (
    MAX_CURVE_EPOCHS,
    check_curve_task,
    curve_epochs,
    curve_scoring_interval,
    parse_labels_per_class,
    per_class_sample,
)


def labelled_split(labels: list[int]) -> Split:
    return Split("train.jsonl", [(f"text {i}",) for i in range(len(labels))], labels,
                 [str(i) for i in range(len(labels))])


def test_counts_are_distinct_positive_and_sorted():
    assert parse_labels_per_class("32, 8") == [8, 32]
    for bad in ("", "8,8", "0,8", "eight"):
        with pytest.raises(PipelineError, match="--labels-per-class"):
            parse_labels_per_class(bad)


def test_a_draw_takes_n_of_each_class_is_fixed_by_seed_and_count_and_keeps_file_order():
    split = labelled_split([0] * 50 + [1] * 30 + [2] * 5)
    sample = per_class_sample(split, 8, seed=1)
    assert [sample.labels.count(c) for c in (0, 1, 2)] == [8, 8, 5]  # a class with fewer gives all it has
    assert [int(i) for i in sample.ids] == sorted(int(i) for i in sample.ids)
    assert per_class_sample(split, 8, seed=1).ids == sample.ids  # the same draw for the other arm
    assert per_class_sample(split, 8, seed=2).ids != sample.ids
    assert set(per_class_sample(split, 8, seed=1).ids) != set(per_class_sample(split, 9, seed=1).ids[:21])


def test_fewer_examples_get_more_epochs_within_bounds():
    assert curve_epochs(3, full_examples=500, examples=500) == 3
    assert curve_epochs(3, full_examples=500, examples=250) == 6  # about the full run's steps
    assert curve_epochs(3, full_examples=500, examples=10) == MAX_CURVE_EPOCHS
    assert curve_epochs(30, full_examples=500, examples=10) == 30  # never fewer than the full run


def test_a_point_is_scored_about_as_often_as_the_full_run():
    assert curve_scoring_interval(MAX_CURVE_EPOCHS, full_epochs=4) == 5  # epochs 5, 10, 15, 20
    assert curve_scoring_interval(6, full_epochs=3) == 2
    assert curve_scoring_interval(3, full_epochs=3) == 1  # a point as long as the full run: every epoch


def test_only_classification_tasks_have_a_curve():
    regression = TaskSpec("stsb", ("a", "b"), "score", None, ("pearson",))
    split = Split("train.tsv", [("a", "b")], [0.5], ["1"])
    with pytest.raises(PipelineError, match="stsb is not a classification task"):
        check_curve_task(TaskData(regression, split, {"dev": split}, {}))


@pytest.fixture
def keyword_task(tmp_path):
    for name, n, seed in (("train", 240, 0), ("dev", 80, 1)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keyword_rows(n, seed)))
    cfg = {"task": "custom",
           "data": {"train_file": str(tmp_path / "train.jsonl"), "validation_file": str(tmp_path / "dev.jsonl"),
                    "text_fields": ["text"], "label_field": "label", "max_seq_len": 32},
           "train": {"output_dir": str(tmp_path / "ft"), "learning_rate": 1e-3, "batch_size": 16, "epochs": 2,
                     "warmup_ratio": 0.1, "eval_batch_size": 64},
           "tracking": {"enabled": False}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_each_point_trains_every_seed_on_its_draw_and_a_rerun_skips_them(keyword_task, tiny_model, capsys):  # noqa: F811
    args = ["--config", keyword_task / "config.json", "--model", tiny_model, "--from-scratch", "--seeds", "1,2",
            "--sweep", "train.learning_rate=3e-3", "--labels-per-class", "4,16"]
    finetune(*args)
    ft = keyword_task / "ft"
    report = json.loads((ft / "metrics.json").read_text())
    curve = report["label_curve"]
    assert [p["labels_per_class"] for p in curve] == [4, 16, "all"]
    assert [p["examples"] for p in curve[:2]] == [8, 32]
    assert curve[-1]["examples"] == report["selection"]["fit"]  # the full point trains on train minus the slice
    assert curve[-1]["median"] == report["accuracy"] and curve[-1]["per_seed"] == [
        s["accuracy"] for s in report["per_seed"]]
    assert curve[0]["epochs"] == MAX_CURVE_EPOCHS and curve[-1]["epochs"] == 2
    for point in curve[:2]:
        n = point["labels_per_class"]
        for seed in (1, 2):
            seed_dir = ft / f"labels_{n}_per_class" / f"seed_{seed}"
            record = json.loads((seed_dir / "complete.json").read_text())
            assert record["protocol"]["labels_per_class"] == n
            history = json.loads((seed_dir / "history.json").read_text())
            scored = [e["epoch"] for e in history if "select_accuracy" in e]
            every = record["protocol"]["score_every"]
            assert scored == list(range(every, point["epochs"] + 1, every)) and scored[-1] == point["epochs"]
            assert len(scored) <= 2 and len(history) == point["epochs"]  # as often as the full run's 2 epochs
            assert "select_accuracy" in record["metrics"]  # the slice chose its epoch, dev only reports
            assert not (seed_dir / "model").exists()  # a point keeps no weights
        assert point["median"] == sorted(point["per_seed"])[0] + (
            sorted(point["per_seed"])[1] - sorted(point["per_seed"])[0]) / 2
    out = capsys.readouterr().out
    assert '"label_curve": {"4":' in out

    finetune(*args)
    assert capsys.readouterr().out.count("finished before") == 1 + 2 + 4  # the trial, 2 seeds, 2 points × 2 seeds
    assert json.loads((ft / "metrics.json").read_text())["label_curve"] == curve


def test_a_curve_needs_the_protocol(keyword_task, tiny_model, capsys):  # noqa: F811
    with pytest.raises(SystemExit) as stop:
        finetune("--config", keyword_task / "config.json", "--model", tiny_model, "--labels-per-class", "8")
    assert stop.value.code == 2 and "--labels-per-class: only with --sweep" in capsys.readouterr().err
