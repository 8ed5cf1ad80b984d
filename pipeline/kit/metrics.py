"""Classification metrics for notebooks: precision/recall/F1, confusion matrix, and a model-over-loader evaluation.

scikit-learn counts and computes precision/recall/F1,
`pipeline/finetune/families/sequence/confusion_figure.py` draws the confusion matrix, and accuracy goes through the
fine-tuning metrics
(`pipeline/finetune/families/metrics.py`), so a Kit evaluation and a fine-tuning run report the same number.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from pipeline.finetune.families.metrics import metric


def compute_precision_recall_f1(y_true: Sequence[int], y_pred: Sequence[int],
                                label_names: Sequence[str] | None = None) -> dict:
    """Per-class precision, recall, F1 and support, plus their macro, micro and weighted averages."""
    from sklearn.metrics import precision_recall_fscore_support

    classes = _classes(y_true, y_pred, label_names)
    names = list(label_names) if label_names else [str(c) for c in classes]
    p, r, f, s = precision_recall_fscore_support(y_true, y_pred, labels=classes, zero_division=0)
    result: dict = {"per_class": {name: {"precision": float(p[i]), "recall": float(r[i]), "f1": float(f[i]),
                                         "support": int(s[i])} for i, name in enumerate(names)}}
    for average in ("macro", "micro", "weighted"):
        p, r, f, _ = precision_recall_fscore_support(y_true, y_pred, labels=classes, average=average,
                                                     zero_division=0)
        result[average] = {"precision": float(p), "recall": float(r), "f1": float(f)}
    return result


def compute_confusion_matrix(y_true: Sequence[int], y_pred: Sequence[int], num_classes: int | None = None,
                             label_names: Sequence[str] | None = None,
                             png: str | os.PathLike | None = None) -> np.ndarray:
    """Counts with true classes as rows and predictions as columns; also drawn to `png` when given."""
    from sklearn.metrics import confusion_matrix

    classes = list(range(num_classes)) if num_classes else _classes(y_true, y_pred, label_names)
    matrix = confusion_matrix(y_true, y_pred, labels=classes)
    if png is not None:
        from pipeline.finetune.families.sequence.confusion_figure import draw_confusion

        draw_confusion(png, matrix, list(label_names) if label_names else [str(c) for c in classes])
    return matrix


@torch.no_grad()
def evaluate_classification_metrics(model, loader, device: str | torch.device, num_classes: int,
                                    label_names: Sequence[str] | None = None) -> dict:
    """Accuracy, F1 (binary for 2 classes, else macro), every precision/recall/F1 figure and the confusion matrix.

    `model` is an HF `*ForSequenceClassification` model (or any module returning logits, or an
    object with `.logits`) called on the loader's batches without their labels.
    """
    was_training = model.training
    model.eval()
    predictions, golds = [], []
    for batch in loader:
        batch = {k: v.to(device) for k, v in batch.items()}
        labels = batch.pop("labels")
        out = model(**batch)
        logits = out.logits if hasattr(out, "logits") else out
        predictions.append(logits.argmax(-1).cpu())
        golds.append(labels.cpu())
    model.train(was_training)
    y_pred, y_true = torch.cat(predictions).numpy(), torch.cat(golds).numpy()
    report = compute_precision_recall_f1(y_true, y_pred, label_names or [str(i) for i in range(num_classes)])
    return {"accuracy": metric("accuracy", y_pred, y_true),
            "f1": metric("f1", y_pred, y_true) if num_classes == 2 else report["macro"]["f1"],
            "f1_macro": report["macro"]["f1"], "report": report,
            "confusion_matrix": compute_confusion_matrix(y_true, y_pred, num_classes)}


def _classes(y_true, y_pred, label_names) -> list[int]:
    if label_names:
        return list(range(len(label_names)))
    return sorted(set(np.asarray(y_true).tolist()) | set(np.asarray(y_pred).tolist()))
