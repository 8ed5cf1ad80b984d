"""A fine-tuned model's proof: one dev batch through the model in memory, as it was fine-tuned and evaluated (its
device, the accelerator's mixed precision), and through the saved folder loaded by the Auto class of its head.

The saved folder is what the hub interface, `predict.py`, MLflow and every user load; the dev figures were
measured on the model in memory. The comparison (`pipeline/models/output_agreement.py`) shows they are one model.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.models.output_agreement import Agreement, compare_logits

HEAD_AUTO_CLASSES = {"ForSequenceClassification": "AutoModelForSequenceClassification",
                     "ForTokenClassification": "AutoModelForTokenClassification",
                     "ForQuestionAnswering": "AutoModelForQuestionAnswering"}
"""The Auto class that loads a saved head, by the end of the model's class name."""

OUTPUT_FIELDS = ("logits", "start_logits", "end_logits")


def auto_class_name(model: torch.nn.Module) -> str:
    name = type(model).__name__
    return next(auto for head, auto in HEAD_AUTO_CLASSES.items() if name.endswith(head))


def check_saved_model(model: torch.nn.Module, folder: Path, batch: dict[str, torch.Tensor],
                      precision: str) -> Agreement:
    """`model` (in memory, on its device) and the folder it was saved to, on `batch`."""
    import transformers

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    with torch.no_grad():
        reference = model(**{k: v.to(device) for k, v in batch.items()})
        saved = getattr(transformers, auto_class_name(model)).from_pretrained(folder).eval()(**batch)
    model.train(was_training)
    fields = [f for f in OUTPUT_FIELDS if getattr(reference, f, None) is not None]
    mixed = "" if precision == "fp32" else f", {precision} autocast"
    return compare_logits([getattr(reference, f) for f in fields], [getattr(saved, f) for f in fields], precision,
                          f"{type(model).__name__} in memory as fine-tuned ({device.type}{mixed}), a dev batch")
