"""The Kit's metrics equal scikit-learn's, and an evaluation over a loader reports them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_recall_fscore_support

from pipeline.kit import compute_confusion_matrix, compute_precision_recall_f1, evaluate_classification_metrics

rng = np.random.default_rng(0)
Y_TRUE = rng.integers(0, 3, 200)
Y_PRED = np.where(rng.random(200) < 0.6, Y_TRUE, rng.integers(0, 3, 200))


def test_precision_recall_f1_match_scikit_learn():
    report = compute_precision_recall_f1(Y_TRUE, Y_PRED, ["a", "b", "c"])
    p, r, f, s = precision_recall_fscore_support(Y_TRUE, Y_PRED)
    assert [report["per_class"][n]["f1"] for n in "abc"] == pytest.approx(f.tolist())
    assert [report["per_class"][n]["support"] for n in "abc"] == s.tolist()
    for average in ("macro", "micro", "weighted"):
        assert report[average]["f1"] == pytest.approx(f1_score(Y_TRUE, Y_PRED, average=average))
    assert report["micro"]["precision"] == pytest.approx(accuracy_score(Y_TRUE, Y_PRED))


def test_confusion_matrix_matches_scikit_learn_and_draws_a_png(tmp_path):
    matrix = compute_confusion_matrix(Y_TRUE, Y_PRED, 3, png=tmp_path / "cm.png")
    assert (matrix == confusion_matrix(Y_TRUE, Y_PRED)).all()
    assert (tmp_path / "cm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluation_over_a_loader():
    class Fixed(torch.nn.Module):
        """Predicts the class stored in the first input id."""

        def forward(self, input_ids, attention_mask=None):
            return torch.nn.functional.one_hot(input_ids[:, 0], 3).float()

    loader = [{"input_ids": torch.tensor(Y_PRED[i:i + 32])[:, None], "labels": torch.tensor(Y_TRUE[i:i + 32])}
              for i in range(0, 200, 32)]
    result = evaluate_classification_metrics(Fixed(), loader, "cpu", num_classes=3)
    assert result["accuracy"] == pytest.approx(accuracy_score(Y_TRUE, Y_PRED))
    assert result["f1"] == pytest.approx(f1_score(Y_TRUE, Y_PRED, average="macro"))
    assert (result["confusion_matrix"] == confusion_matrix(Y_TRUE, Y_PRED)).all()
