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
