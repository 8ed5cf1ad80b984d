"""Official GLUE metrics, computed with scikit-learn and scipy."""

from __future__ import annotations

import numpy as np


def metric(name: str, predictions: np.ndarray, labels: np.ndarray) -> float:
    """One metric by its official name (`accuracy`, `f1`, `matthews_correlation`, `pearson`, …)."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    base = name.removesuffix("_matched").removesuffix("_mismatched")
    if base == "accuracy":
        return float(accuracy_score(labels, predictions))
    if base == "f1":
        return float(f1_score(labels, predictions))
    if base == "f1_macro":
        return float(f1_score(labels, predictions, average="macro"))
    if base == "matthews_correlation":
        return float(matthews_corrcoef(labels, predictions))
    if base == "pearson":
        return float(pearsonr(predictions, labels)[0])
    if base == "spearman":
        return float(spearmanr(predictions, labels)[0])
    raise ValueError(f"unknown metric {name!r}")


def task_metrics(metric_names: tuple[str, ...], dev_predictions: dict[str, np.ndarray],
                 dev_labels: dict[str, np.ndarray]) -> dict[str, float]:
    """The task's metrics over its dev splits; MNLI's `accuracy_matched` reads the `matched` split."""
    results = {}
    for name in metric_names:
        split = next((s for s in dev_predictions if name.endswith("_" + s)), None) or next(iter(dev_predictions))
        results[name] = metric(name, dev_predictions[split], dev_labels[split])
    return results
