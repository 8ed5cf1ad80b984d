"""The classification metrics, counted from one confusion matrix, give scikit-learn's values to the last bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.finetune.families.metrics import metric


def sklearn_metric(name: str, predictions, labels) -> float:
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    return float({"accuracy": lambda: accuracy_score(labels, predictions),
                  "f1": lambda: f1_score(labels, predictions, zero_division=0.0),
                  "f1_macro": lambda: f1_score(labels, predictions, average="macro", zero_division=0.0),
                  "matthews_correlation": lambda: matthews_corrcoef(labels, predictions)}[name]())


def pairs(classes: int):
    """(predictions, labels): equal-length arrays of class ids below `classes`, one example at least."""
    return st.integers(1, 60).flatmap(lambda n: st.tuples(
        *(st.lists(st.integers(0, classes - 1), min_size=n, max_size=n).map(np.array) for _ in range(2))))


@settings(max_examples=120, derandomize=True, database=None, deadline=None)
@given(pairs(2))
def test_binary_metrics_equal_scikit_learns(case):
    predictions, labels = case
    for name in ("accuracy", "f1", "f1_macro", "matthews_correlation"):
        assert metric(name, predictions, labels) == sklearn_metric(name, predictions, labels), name


@settings(max_examples=120, derandomize=True, database=None, deadline=None)
@given(pairs(6))
def test_multiclass_metrics_equal_scikit_learns(case):
    predictions, labels = case
    for name in ("accuracy", "f1_macro", "matthews_correlation"):
        assert metric(name, predictions, labels) == sklearn_metric(name, predictions, labels), name


def test_undefined_scores_are_zero_as_in_scikit_learn():
    ones = np.ones(5, dtype=int)
    assert metric("matthews_correlation", ones, ones) == 0.0  # one class only: no correlation to speak of
    assert metric("f1", np.zeros(4, dtype=int), np.zeros(4, dtype=int)) == 0.0  # no positive predicted or true
    assert metric("accuracy_matched", ones, ones) == 1.0  # MNLI's names read the same metric


def test_correlations_are_scipys_and_a_misfit_is_refused():
    x = np.array([0.1, 0.4, 0.35, 0.8])
    y = np.array([0.0, 0.5, 0.3, 0.9])
    assert metric("pearson", x, y) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert metric("spearman", x, y) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="3 labels against 2 predictions"):
        metric("accuracy", np.array([1, 0]), np.array([1, 0, 1]))
