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


# SQuAD's official evaluation (v2.0 script, which equals v1.1's on answerable questions):
# lower case, strip punctuation, drop the articles a/an/the, collapse whitespace.
def normalize_answer(text: str) -> str:
    import re
    import string

    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text, flags=re.UNICODE).split())


def answer_f1(prediction: str, gold: str) -> float:
    from collections import Counter

    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not expected:  # a no-answer gold (v2) matches only an empty prediction
        return float(predicted == expected)
    same = sum((Counter(predicted) & Counter(expected)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(predictions: dict[str, str], golds: dict[str, list[str]]) -> dict[str, float]:
    """Exact match and F1 in percent, as the official script reports them: max over gold answers, mean over questions.

    A question whose gold answers all normalise to nothing is a no-answer question (SQuAD 2.0), scored against "".
    """
    missing = golds.keys() - predictions.keys()
    if missing:
        raise ValueError(f"{len(missing)} questions have no prediction (e.g. {next(iter(missing))!r})")
    em = f1 = 0.0
    for qid, answers in golds.items():
        answers = [a for a in answers if normalize_answer(a)] or [""]
        em += max(float(normalize_answer(predictions[qid]) == normalize_answer(a)) for a in answers)
        f1 += max(answer_f1(predictions[qid], a) for a in answers)
    return {"exact_match": 100 * em / len(golds), "f1": 100 * f1 / len(golds)}
