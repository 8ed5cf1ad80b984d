"""The main job ends with what was built, the headline figures and the next commands, read from its run folder."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pipeline.common.config.shipped_configs import find_config
from pipeline.tracking.finetune_report import finetune_result
from pipeline.tracking.job_summary import SEED_SPREAD, last_eval, render_summary


def _point(per_class, examples, values):
    return {"labels_per_class": per_class, "examples": examples, "epochs": 3, "metric": "accuracy",
            "median": sorted(values)[1], "min": min(values), "max": max(values), "per_seed": values}


def _finetune_report(curve: dict) -> dict:
    """An arm's metrics.json: `curve` maps labels per class (8, 32, "all") to three seeds' accuracies."""
    accuracies = curve["all"]
    median = sorted(accuracies)[len(accuracies) // 2]
    return {"accuracy": median, "accuracy_mean": sum(accuracies) / 3, "accuracy_std": 0.01,
            "macro_f1": 0.5, "macro_f1_mean": 0.5, "macro_f1_std": 0.0,
            "metric": "accuracy", "task": "custom", "seeds": [1, 2, 3], "from_scratch": False,
            "per_seed": [{"accuracy": a} for a in accuracies],
            "label_curve": [_point(n, 48 if n == 8 else 192 if n == 32 else 505, v) for n, v in curve.items()]}


ARMS = {
    ("keywords", "pretrained"): {8: [0.50, 0.55, 0.52], 32: [0.80, 0.82, 0.81], "all": [0.93, 0.94, 0.95]},
    ("keywords", "from-scratch"): {8: [0.60, 0.62, 0.61], 32: [0.80, 0.83, 0.79], "all": [0.93, 0.95, 0.96]},
    ("word-order", "pretrained"): {8: [0.50, 0.52, 0.51], 32: [0.55, 0.56, 0.54], "all": [0.61, 0.64, 0.62]},
    ("word-order", "from-scratch"): {8: [0.49, 0.50, 0.51], 32: [0.50, 0.51, 0.49], "all": [0.40, 0.45, 0.41]},
}


@pytest.fixture(autouse=True)
def seed_record(tmp_path) -> Path:
    """A path for the seed benchmark's record: none there unless a test writes it (the checkout's own record is
    not what these tests read)."""
    return tmp_path / "main_job_seeds.json"


@pytest.fixture
def run_folder(tmp_path) -> Path:
    """A finished main job's files, as the stages write them (contents made up, formats real)."""
    out = tmp_path / "run"
    (out / "shards").mkdir(parents=True)
    (out / "shards" / "index.json").write_text(json.dumps({
        "seq_len": 128, "tokenizer": {"vocab_size": 8000},
        "totals": {"sequences": 3323, "documents": 2277},
        "splits": {"train": {"sequences": 3179}, "val": {"sequences": 144}}}))
    (out / "pretrain" / "export").mkdir(parents=True)
    records = [{"step": 100, "eval/mlm_loss": 6.5, "eval/perplexity": 665.1},
               {"step": 199, "train/loss": 5.9},
               {"step": 200, "eval/mlm_loss": 5.25, "eval/perplexity": 190.6, "eval/unigram_entropy": 6.42},
               {"step": 200, "train/loss": 5.8}]
    (out / "pretrain" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 2')
    for (task, arm), curve in ARMS.items():
        (out / "finetune" / task / arm).mkdir(parents=True)
        (out / "finetune" / task / arm / "metrics.json").write_text(json.dumps(_finetune_report(curve)))
    for task, accuracy in (("keywords", 0.945), ("word-order", 0.49)):
        (out / "tasks" / task).mkdir(parents=True)
        (out / "tasks" / task / "token-baseline.json").write_text(json.dumps({"task": "custom", "accuracy": accuracy}))
    (out / "minimal-pairs.json").write_text(json.dumps({
        "model_scores": {"overall": {"accuracy": 0.64, "pairs": 300},
                         "groups": {"agreement": {"accuracy": 0.7, "pairs": 100}}},
        "unigram_scores": {"overall": {"accuracy": 0.5, "pairs": 300},
                           "groups": {"agreement": {"accuracy": 0.51, "pairs": 100}}}}))
    (out / "cloze.json").write_text(json.dumps({
        "accuracy": 0.3125, "masked": 2400, "constant_accuracy": 0.061, "examples": [
            {"masked_text": "Return the <mask> of the list.", "answer": " length",
             "top": [{"token": " length", "probability": 0.41}, {"token": " number", "probability": 0.2},
                     {"token": " size", "probability": 0.1}]},
            {"masked_text": "x" * 80 + " <mask> " + "y" * 80, "answer": " z",
             "top": [{"token": "\n", "probability": 0.3}, {"token": " b", "probability": 0.2},
                     {"token": " c", "probability": 0.1}]}]}))
    (out / "compare").mkdir()
    for name in ("train_loss.png", "eval_mlm_loss.png"):
        (out / "compare" / name).write_bytes(b"png")
    return out


def test_the_last_evaluation_is_the_headline_and_a_cut_line_is_skipped(run_folder):
    record = last_eval(run_folder / "pretrain" / "metrics.jsonl")
    assert record["step"] == 200 and record["eval/mlm_loss"] == 5.25
    assert last_eval(run_folder / "missing.jsonl") is None


def test_an_arms_headline_is_its_main_metric_with_its_label_curve(run_folder):
    result = finetune_result(run_folder / "finetune" / "word-order" / "pretrained" / "metrics.json")
    assert (result.metric, result.median, result.seeds) == ("accuracy", 0.62, 3)
    assert [(p.labels_per_class, p.median, p.low, p.high) for p in result.curve] == [
        (8, 0.51, 0.50, 0.52), (32, 0.55, 0.54, 0.56), ("all", 0.62, 0.61, 0.64)]


def test_summary_names_what_was_built_the_figures_and_the_next_commands(run_folder):
    text = render_summary(run_folder, seconds=412.4)
    assert text.splitlines()[0] == f"== main job done in 412 s; everything is in {run_folder}"
    assert "8,000-token vocabulary; 3,323 sequences × 128 tokens (144 for validation)" in text
    assert "pretrain/export/" in text and "200 steps" in text
    assert "(2 plots)" in text
    assert "validation MLM loss  5.250 at step 200 (perplexity 190.6)" in text
    assert "unigram entropy      6.420 (the plateau" in text and "loss is 1.170 nats below it" in text
    assert ("cloze accuracy       0.312 top-1 at 2,400 masked validation tokens (always the most "
            "frequent token: 0.061)") in text
    assert "  Return the <mask> of the list.  ('length'; 'length' 0.41, 'number' 0.20, 'size' 0.10)" in text
    long_example = next(line for line in text.splitlines() if "'z'" in line)
    assert long_example.startswith("  …x") and "x <mask> y" in long_example and len(long_example) < 120
    assert "('z'; '\\n' 0.30, 'b' 0.20, 'c' 0.10)" in long_example  # a newline filling stays visible
    assert "minimal pairs        0.640 on 300 held-out pairs (unigram model 0.500); agreement " \
        "0.70/0.51" in text
    table = text.split("tasks (dev accuracy")[1].splitlines()
    assert table[1].split() == ["task", "labels/class", "pretrained", "from", "scratch", "gap", "token", "counts"]
    assert table[4].split() == ["all", "(505", "in", "total)", "0.940", "[0.93–0.95]", "0.950", "[0.93–0.96]",
                                "-0.010", "0.945"]
    assert table[5].split()[:3] == ["word-order", "8", "0.510"]
    assert f"mlflow ui --backend-store-uri sqlite:///{run_folder / 'mlflow.db'} --host 127.0.0.1" in text
    assert f"python launchers/compare.py --uri sqlite:///{run_folder / 'mlflow.db'}" in text
    keywords_model = run_folder / "finetune" / "keywords" / "pretrained"
    assert f"python launchers/predict.py --model {keywords_model} --task custom '" in text
    assert len(text.splitlines()) <= 40  # fits a screen


def findings(run_folder) -> list[str]:
    text = render_summary(run_folder)
    return [line.strip() for line in text.split("tasks (dev accuracy")[1].splitlines() if ": " in line]


def test_a_task_that_counting_words_solves_is_called_so(run_folder):
    assert ("keywords: counting words (0.945) does as well as both arms, so this task cannot show what pretraining "
            "buys") in findings(run_folder)
    assert "word-order: pretrained +0.210 against from scratch with all labels; counting words gets 0.490" \
        in findings(run_folder)


def test_a_point_where_pretrained_falls_below_scratch_beyond_the_seeds_spread_is_named(run_folder):
    below = [line for line in findings(run_folder) if "BELOW" in line]
    # keywords at 8 per class: 0.52 against 0.61, spread 0.05; at 32: 0.81 against 0.80, no
    assert below == ["keywords: with 8 labelled examples per class pretrained is BELOW from scratch by 0.090, more "
                     "than the seeds' spread (0.050)"]
    # With all labels the token-count baseline (measured on that split) stands beside the sentence.
    path = run_folder / "finetune" / "keywords" / "pretrained" / "metrics.json"
    report = json.loads(path.read_text())
    report["label_curve"][-1].update(median=0.90, min=0.89, max=0.91)
    path.write_text(json.dumps(report))
    assert [line for line in findings(run_folder) if "BELOW" in line][-1] == (
        "keywords: with all 505 labelled examples pretrained is BELOW from scratch by 0.050, more than the seeds' "
        "spread (0.030); counting words gets 0.945")


def test_the_settings_each_arm_chose_are_shown_when_the_arms_were_swept(run_folder):
    assert not [line for line in findings(run_folder) if "chosen on held-out train" in line]
    for arm, lr in (("pretrained", "1e-3"), ("from-scratch", "2e-4")):
        path = run_folder / "finetune" / "keywords" / arm / "metrics.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "chosen_setting": {"train.learning_rate": lr}}))
    assert ("keywords: chosen on held-out train: pretrained train.learning_rate=1e-3; from scratch "
            "train.learning_rate=2e-4") in findings(run_folder)


def test_the_label_curve_plot_has_a_panel_per_task(run_folder):
    from pipeline.common.run_layout import MainJobLayout
    from pipeline.tracking.label_curve_plot import plot_label_curves

    layout = MainJobLayout(run_folder)
    assert plot_label_curves(layout)
    assert layout.label_curve_plot.read_bytes()[:4] == b"\x89PNG"
    assert "and the label-efficiency curve (3 plots)" in render_summary(run_folder)


def test_missing_results_are_named_not_invented(run_folder):
    (run_folder / "finetune" / "word-order" / "from-scratch" / "metrics.json").unlink()
    (run_folder / "pretrain" / "metrics.jsonl").unlink()
    (run_folder / "cloze.json").unlink()
    text = render_summary(run_folder, predict_cli=False)
    assert "unigram entropy" not in text and "cloze" not in text and "fill-mask" not in text
    assert "validation MLM loss  not found in" in text
    assert next(line for line in text.splitlines() if "word-order" in line).split() == [
        "word-order", "no", "result", "for", "from", "scratch"]
    assert "launchers/predict.py is coming" in text


def test_the_headline_is_the_named_main_metric_even_when_another_sorts_first(tmp_path):
    report = {"accuracy": 0.70, "accuracy_mean": 0.70, "accuracy_std": 0.01, "f1": 0.81, "f1_mean": 0.80,
              "f1_std": 0.01, "metric": "f1", "seeds": [1, 2], "per_seed": [{"f1": 0.80}, {"f1": 0.82}]}
    (tmp_path / "metrics.json").write_text(json.dumps(report))  # written with sorted keys, as the runner does
    result = finetune_result(tmp_path / "metrics.json")
    assert (result.metric, result.median, result.curve[0].low, result.curve[0].high) == ("f1", 0.81, 0.80, 0.82)
    del report["metric"]  # a file from before the main metric was named: a sweep's selection metric names it
    (tmp_path / "metrics.json").write_text(json.dumps({**report, "selection": {"metric": "f1"}}))
    assert finetune_result(tmp_path / "metrics.json").metric == "f1"
    (tmp_path / "metrics.json").write_text(json.dumps(report))  # else its first summarised metric
    assert finetune_result(tmp_path / "metrics.json").metric == "accuracy"


def test_an_arm_without_a_label_curve_is_one_row_of_all_its_labels(run_folder):
    for arm in ("pretrained", "from-scratch"):
        path = run_folder / "finetune" / "word-order" / arm / "metrics.json"
        report = json.loads(path.read_text())
        del report["label_curve"]
        path.write_text(json.dumps(report))
    table = render_summary(run_folder).split("tasks (dev accuracy")[1].splitlines()
    word_order = [line.split() for line in table if line.split()[:1] == ["word-order"]]
    assert word_order == [["word-order", "all", "0.620", "[0.61–0.64]", "0.410", "[0.40–0.45]", "+0.210", "0.490"]]


def test_the_summary_names_the_runs_seed_and_the_recipes_spread_from_the_seed_benchmarks_record(run_folder,
                                                                                                seed_record):
    def summary() -> str:
        return render_summary(run_folder, seed_record=seed_record)

    assert "pretraining seed" not in summary()  # a folder from before the seed was recorded
    (run_folder / "pretrain" / "config.json").write_text(json.dumps({"train": {"seed": 3, "max_steps": 800}}))
    assert "pretraining seed     3 (--seed N picks another)" in summary() and "recipe's spread" not in summary()
    sentence = "5 pretraining seeds: word order +9.0 [+2.0 – +14.0] points over scratch"
    shipped = hashlib.sha256(find_config("main-job", "pretrain").read_bytes()
                             + find_config("word-order", "finetune").read_bytes()).hexdigest()
    seed_record.write_text(json.dumps({"recipe_sha256": shipped, "results": {"headline": {
        SEED_SPREAD: {"value": sentence}, "word-order gain, worst seed": {"value": "+2.0 points"}}}}))
    assert f"the recipe's spread  {sentence} (benchmarks/main_job_seeds.py)" in summary()
    assert "recipe's spread" not in render_summary(run_folder)  # no record named (an installed package's job)
    seed_record.write_text(json.dumps({"recipe_sha256": "0" * 64, "results": {"headline": {
        SEED_SPREAD: {"value": sentence}}}}))
    stale = "(measured on another recipe: configs/main-job.json or configs/glue/word-order.json)"
    assert f"{sentence} {stale}" in summary()
    assert len(summary().splitlines()) <= 42


def test_each_arms_model_card_sets_its_figures_beside_the_other_arm_and_the_token_counts(run_folder):
    from huggingface_hub import ModelCard

    from pipeline.commands.run_default import record_arm_baselines
    from pipeline.common.run_layout import MainJobLayout

    layout = MainJobLayout(run_folder)
    for (task, arm), _ in ARMS.items():
        model = layout.finetune(task, arm).seed(1).model
        model.mkdir(parents=True)
        (model / "config.json").write_text(json.dumps({"architectures": ["ModernBertForSequenceClassification"]}))
        (model / "pipeline_finetune.json").write_text(json.dumps({
            "task": "custom", "task_type": "classification", "labels": ["a", "b"], "seed": 1,
            "metrics": {"accuracy": 0.9}, "best_epoch": 2, "from_scratch": arm == "from-scratch",
            "source_model": str(run_folder / "pretrain" / "export")}))
    record_arm_baselines(layout)
    card = ModelCard.load(layout.finetune("word-order", "pretrained").seed(1).model / "README.md")
    assert "| from scratch | accuracy | 0.410 | median of 3 seeds, the same protocol |" in card.text
    assert "| token counts | accuracy | 0.490 | bag of words + logistic regression on the same split |" in card.text
    assert "| median of 3 seeds | accuracy | 0.620 [0.610–0.640] |  |" in card.text
    scratch = ModelCard.load(layout.finetune("word-order", "from-scratch").seed(1).model / "README.md")
    assert "| pretrained | accuracy | 0.620 |" in scratch.text and scratch.data.base_model is None
