"""Which parameters an optimizer decays: the one rule that pretraining's engine and fine-tuning's trainer share."""

from __future__ import annotations

import torch


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Optimizer groups: decay on weight matrices, none on biases and LayerNorm (as in BERT and RoBERTa).

    LAMB also skips its trust ratio in the second group. Norms are found
    by module type, not by name: every name in the pre-LN model contains "roberta_prelayernorm".
    """
    norms = {id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()}
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if name.endswith("bias") or id(param) in norms or param.ndim < 2 else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
