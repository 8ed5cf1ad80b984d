"""Classification heads of the hub interface: every head maps features (B×T×C) to logits (B×K).

Heads are transformers' own modules. A RoBERTa head is `RobertaClassificationHead` (the `<s>`
feature → dense → tanh → projection, as in fairseq); a fine-tuned BERT head is BERT's pooler
followed by its dropout and linear classifier, exactly the computation of
`BertForSequenceClassification`, so a loaded fine-tuned model predicts what it predicted in training.
A ModernBERT head pools the first token (`cls`) or the mean of the non-padding tokens (`mean`), as
`ModernBertForSequenceClassification` does; the mean needs the padding mask, which `forward` takes.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

IGNORE_INDEX = -100
"""The label of a position no head is scored on (torch's cross-entropy `ignore_index`): unmasked tokens in
pretraining, special tokens and later sub-tokens in token tagging."""


class ClassificationHead(nn.Module):
    """A head plus what it predicts: label names in class-id order, or None for regression."""

    def __init__(self, net: nn.Module, labels: tuple[str, ...] | None, max_seq_len: int | None = None):
        super().__init__()
        self.net = net
        self.labels = labels
        self.max_seq_len = max_seq_len
        """The sequence length the head was trained with (inputs were truncated to it), when known."""

    @property
    def regression(self) -> bool:
        return self.labels is None

    def forward(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits from features B×T×C; `mask` (B×T, 1 at real tokens) is used by heads that pool over tokens."""
        if isinstance(self.net, ModernBertHead):
            return self.net(features, mask)
        return self.net(features)


class PooledHead(nn.Module):
    """BERT's sequence-classification head: pooler ([CLS] → dense → tanh) → dropout → linear."""

    def __init__(self, pooler: nn.Module, dropout: nn.Module, classifier: nn.Linear):
        super().__init__()
        self.pooler, self.dropout, self.classifier = pooler, dropout, classifier

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.pooler(features)))


class ModernBertHead(nn.Module):
    """ModernBERT's sequence-classification head: pool (`cls`: features[:, 0]; `mean`: the mean of the real
    tokens, as `ModernBertForSequenceClassification` does) → head → dropout → linear."""

    def __init__(self, pooling: str, head: nn.Module, dropout: nn.Module, classifier: nn.Linear):
        super().__init__()
        self.pooling, self.head, self.dropout, self.classifier = pooling, head, dropout, classifier

    def forward(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.pooling == "cls":
            pooled = features[:, 0]
        else:
            mask = torch.ones(features.shape[:2], device=features.device) if mask is None else mask
            mask = mask.to(features.dtype).unsqueeze(-1)
            pooled = (features * mask).sum(dim=1) / mask.sum(dim=1)
        return self.classifier(self.dropout(self.head(pooled)))


def new_head(config, num_classes: int, init_weights) -> nn.Module:
    """A freshly initialised fairseq-style head (`RobertaClassificationHead`) for any BERT-family config."""
    from transformers.models.roberta.modeling_roberta import RobertaClassificationHead

    config = copy.copy(config)
    config.num_labels = num_classes
    head = RobertaClassificationHead(config)
    head.apply(init_weights)
    return head


def head_of(model: nn.Module) -> nn.Module:
    """The features → logits part of an HF `*ForSequenceClassification` model."""
    classifier = getattr(model, "classifier", None)
    pooler = getattr(model.base_model, "pooler", None)
    if isinstance(classifier, nn.Linear) and pooler is not None and hasattr(model, "dropout"):
        return PooledHead(pooler, model.dropout, classifier)  # BERT: logits from the pooled [CLS]
    if classifier is not None and hasattr(classifier, "out_proj"):
        return classifier  # RoBERTa and its relatives: the head reads features[:, 0] itself
    if isinstance(classifier, nn.Linear) and hasattr(model, "head") and hasattr(model, "drop"):  # ModernBERT
        pooling = getattr(model.config, "classifier_pooling", "cls")
        if pooling not in ("cls", "mean"):
            from pipeline.common.errors import PipelineError

            raise PipelineError(f"{type(model).__name__}: classifier_pooling {pooling!r}: the hub interface knows "
                                "ModernBERT's 'cls' and 'mean'")
        return ModernBertHead(pooling, model.head, model.drop, classifier)
    from pipeline.common.errors import PipelineError

    raise PipelineError(f"{type(model).__name__}: unsupported classification head; the hub interface knows "
                        "RoBERTa- and BERT-style sequence classifiers")


def label_names(config) -> tuple[str, ...] | None:
    """Label names in class-id order from an HF config's id2label; None for a regression model."""
    if config.problem_type == "regression" or config.num_labels == 1:
        return None
    id2label = {int(k): v for k, v in (config.id2label or {}).items()}
    return tuple(str(id2label.get(i, f"LABEL_{i}")) for i in range(config.num_labels))
