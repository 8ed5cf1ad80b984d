"""The main job ends with what was built, the headline figures and the next commands, read from its run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.tracking.job_summary import finetune_headline, last_eval, render_summary


def _finetune_report(accuracies: list[float]) -> dict:
    median = sorted(accuracies)[len(accuracies) // 2]
    return {"accuracy": median, "accuracy_mean": sum(accuracies) / 3, "accuracy_std": 0.01,
            "macro_f1": 0.5, "macro_f1_mean": 0.5, "macro_f1_std": 0.0,
            "task": "docstring-package", "seeds": [1, 2, 3], "from_scratch": False,
            "per_seed": [{"accuracy": a} for a in accuracies]}


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
    for folder, accuracies in (("pretrained", [0.61, 0.64, 0.62]), ("from-scratch", [0.40, 0.45, 0.41])):
        (out / "finetune" / folder).mkdir(parents=True)
        (out / "finetune" / folder / "metrics.json").write_text(json.dumps(_finetune_report(accuracies)))
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


def test_the_tasks_main_metric_is_the_first_summarised_one(run_folder):
    headline = finetune_headline(run_folder / "finetune" / "pretrained" / "metrics.json")
    assert (headline.task, headline.metric, headline.median, headline.seeds) == ("docstring-package", "accuracy",
                                                                                 0.62, 3)


def test_summary_names_what_was_built_the_figures_and_the_next_commands(run_folder):
    text = render_summary(run_folder, seconds=412.4)
    assert text.splitlines()[0] == f"== main job done in 412 s; everything is in {run_folder}"
    assert "8,000-token vocabulary; 3,323 sequences × 128 tokens (144 for validation)" in text
    assert "pretrain/export/" in text and "200 steps" in text
    assert "(2 plots)" in text
    assert "validation MLM loss                5.250 at step 200 (perplexity 190.6)" in text
    assert "unigram entropy                    6.420 (the plateau" in text and "loss is 1.170 nats below it" in text
    assert ("cloze accuracy                     0.312 top-1 at 2,400 masked validation tokens (always the most "
            "frequent token: 0.061)") in text
    assert "  Return the <mask> of the list.  ('length'; 'length' 0.41, 'number' 0.20, 'size' 0.10)" in text
    long_example = next(line for line in text.splitlines() if "'z'" in line)
    assert long_example.startswith("  …x") and "x <mask> y" in long_example and len(long_example) < 120
    assert "('z'; '\\n' 0.30, 'b' 0.20, 'c' 0.10)" in long_example  # a newline filling stays visible
    assert ("accuracy (docstring-package task)  pretrained 0.620 vs from scratch 0.410 (+0.210; medians of 3 seeds)"
            in text)
    assert f"mlflow ui --backend-store-uri sqlite:///{run_folder / 'mlflow.db'} --host 127.0.0.1" in text
    assert f"python launchers/compare.py --uri sqlite:///{run_folder / 'mlflow.db'}" in text
    assert f"python launchers/predict.py --model {run_folder / 'finetune' / 'pretrained'} --task docstring-package '" \
        in text
    assert len(text.splitlines()) <= 26  # fits a screen with the stages above it


def test_the_token_count_baseline_stands_beside_the_arms_and_says_when_counting_is_enough(run_folder):
    (run_folder / "token-baseline.json").write_text(json.dumps({"task": "custom", "accuracy": 0.5, "f1_macro": 0.4}))
    line = next(x for x in render_summary(run_folder).splitlines() if "token counts" in x)
    assert line.split("token counts (no neural model)")[1].strip() == (
        "0.500 on the same dev split (a bag of words and a logistic regression)")
    (run_folder / "token-baseline.json").write_text(json.dumps({"task": "custom", "accuracy": 0.93}))
    line = next(x for x in render_summary(run_folder).splitlines() if "token counts" in x)
    assert "0.930" in line and "counting words does as well, so this task cannot show what pretraining buys" in line


def test_the_settings_each_arm_chose_are_shown_when_the_arms_were_swept(run_folder):
    assert "chosen on held-out train" not in render_summary(run_folder)
    for folder, lr in (("pretrained", "1e-3"), ("from-scratch", "2e-4")):
        path = run_folder / "finetune" / folder / "metrics.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "chosen_setting": {"train.learning_rate": lr}}))
    line = next(x for x in render_summary(run_folder).splitlines() if "chosen on held-out train" in x)
    assert line.endswith("pretrained train.learning_rate=1e-3; from scratch train.learning_rate=2e-4")


def test_missing_results_are_named_not_invented(run_folder):
    (run_folder / "finetune" / "from-scratch" / "metrics.json").unlink()
    (run_folder / "pretrain" / "metrics.jsonl").unlink()
    (run_folder / "cloze.json").unlink()
    text = render_summary(run_folder, predict_cli=False)
    assert "unigram entropy" not in text and "cloze" not in text and "fill-mask" not in text
    assert "validation MLM loss  not found in" in text
    assert f"no result for from scratch in {run_folder / 'finetune'}" in text
    assert "launchers/predict.py is coming" in text
