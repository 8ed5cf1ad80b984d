"""Official GLUE metrics: the classification ones from a confusion matrix (numpy), correlations by scipy."""

from __future__ import annotations

import numpy as np


def metric(name: str, predictions: np.ndarray, labels: np.ndarray) -> float:
    """One metric by its official name (`accuracy`, `f1`, `matthews_correlation`, `pearson`, …).

    The classification metrics are scikit-learn's formulas (`accuracy_score`, `f1_score` binary and macro,
    `matthews_corrcoef`; a test holds them to scikit-learn's values), counted here from one confusion matrix:
    importing `sklearn.metrics` costs about 1 s of CPU (it imports scipy.stats), more than a small model's
    fine-tuning spends on all its evaluations.
    """
    base = name.removesuffix("_matched").removesuffix("_mismatched")
    if base in ("pearson", "spearman"):
        from scipy.stats import pearsonr, spearmanr

        return float((pearsonr if base == "pearson" else spearmanr)(predictions, labels)[0])
    classes, counts = confusion(labels, predictions)
    if base == "accuracy":
        return float(np.trace(counts) / counts.sum())
    if base == "f1":  # binary: class 1 is the positive one
        positive = np.flatnonzero(classes == 1)
        return float(f1_per_class(counts)[positive[0]]) if positive.size else 0.0
    if base == "f1_macro":
        return float(f1_per_class(counts).mean())
    if base == "matthews_correlation":
        return matthews(counts)
    raise ValueError(f"unknown metric {name!r}")


def confusion(labels: np.ndarray, predictions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the classes in the labels or the predictions, sorted; counts with true classes as rows)."""
    labels, predictions = np.asarray(labels).ravel(), np.asarray(predictions).ravel()
    if labels.shape != predictions.shape or not labels.size:
        raise ValueError(f"metrics: {labels.size} labels against {predictions.size} predictions")
    classes, index = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    n = len(classes)
    counts = np.bincount(index[: labels.size] * n + index[labels.size:], minlength=n * n).reshape(n, n)
    return classes, counts


def f1_per_class(counts: np.ndarray) -> np.ndarray:
    """Each class's F1, 2·tp / (true + predicted), 0 where the class is neither (scikit-learn's zero_division)."""
    true, predicted = counts.sum(axis=1).astype(np.float64), counts.sum(axis=0).astype(np.float64)
    denominator = true + predicted
    return np.divide(2.0 * np.diag(counts), denominator, out=np.zeros_like(denominator), where=denominator > 0)


def matthews(counts: np.ndarray) -> float:
    """Matthews correlation (Gorodkin's multiclass form, as scikit-learn computes it); 0 when it is undefined."""
    true, predicted = counts.sum(axis=1).astype(np.float64), counts.sum(axis=0).astype(np.float64)
    samples, correct = predicted.sum(), float(np.trace(counts))
    cov_true_pred = correct * samples - np.dot(true, predicted)
    cov_pred = samples**2 - np.dot(predicted, predicted)
    cov_true = samples**2 - np.dot(true, true)
    if cov_pred * cov_true == 0:
        return 0.0
    return float(cov_true_pred / np.sqrt(cov_pred * cov_true))


def task_metrics(metric_names: tuple[str, ...], dev_predictions: dict[str, np.ndarray],
                 dev_labels: dict[str, np.ndarray]) -> dict[str, float]:
    """The task's metrics over its dev splits; MNLI's `accuracy_matched` reads the `matched` split."""
    results = {}
    for name in metric_names:
        split = next((s for s in dev_predictions if name.endswith("_" + s)), None) or next(iter(dev_predictions))
        results[name] = metric(name, dev_predictions[split], dev_labels[split])
    return results


def entity_metrics(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Entity-level micro precision, recall and F1 (seqeval's default, conlleval-compatible mode), and F1 per type."""
    from seqeval.metrics import classification_report, f1_score, precision_score, recall_score

    result = {"precision": float(precision_score(gold, predicted)), "recall": float(recall_score(gold, predicted)),
              "f1": float(f1_score(gold, predicted)), "accuracy": token_accuracy(gold, predicted)}
    report = classification_report(gold, predicted, output_dict=True, zero_division=0)
    for name, row in report.items():
        if "avg" not in name:
            result[f"f1_{name}"] = float(row["f1-score"])
    return result


def token_accuracy(gold: list[list[str]], predicted: list[list[str]]) -> float:
    """The fraction of words whose predicted tag equals the gold tag (POS tagging's metric)."""
    pairs = [(g, p) for gs, ps in zip(gold, predicted, strict=True) for g, p in zip(gs, ps, strict=True)]
    return sum(g == p for g, p in pairs) / len(pairs)


# SQuAD's official evaluation: lower case, strip punctuation, drop the articles a/an/the,
# collapse whitespace; exact match and token F1, the maximum over the gold answers.
def normalize_answer(text: str) -> str:
    import re
    import string

    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text, flags=re.UNICODE).split())


def answer_f1(prediction: str, gold: str) -> float:
    """Token F1 of two answers after normalisation (0 when they share no token, as evaluate-v1.1.py)."""
    from collections import Counter

    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((Counter(predicted) & Counter(expected)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(predictions: dict[str, str], golds: dict[str, list[str]]) -> dict[str, float]:
    """Exact match and F1 in percent, as the official scripts report them, averaged over questions.

    An answerable question scores as in evaluate-v1.1.py (the maximum over its gold answers); an
    unanswerable one (SQuAD 2.0, no gold answers) scores 1 for an empty prediction and 0 otherwise,
    as in evaluate-v2.0.py.
    """
    missing = golds.keys() - predictions.keys()
    if missing:
        raise ValueError(f"{len(missing)} questions have no prediction (e.g. {next(iter(missing))!r})")
    em = f1 = 0.0
    for qid, answers in golds.items():
        prediction = predictions[qid]
        if not answers:
            hit = float(normalize_answer(prediction) == "")
            em, f1 = em + hit, f1 + hit
            continue
        em += max(float(normalize_answer(prediction) == normalize_answer(a)) for a in answers)
        f1 += max(answer_f1(prediction, a) for a in answers)
    return {"exact_match": 100 * em / len(golds), "f1": 100 * f1 / len(golds)}
