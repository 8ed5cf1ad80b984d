"""The model section of a config: the encoder's shape and kind, in transformers' own config names, checked when
built."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from pipeline.common.config import size_limits as lim
from pipeline.common.config.tree import refuse, too_small

Pooling = Literal["mean", "cls"]
"""How token vectors become one vector: the mean of the real tokens', or the first token's."""

Architecture = Literal["roberta", "bert", "roberta-prelayernorm", "modernbert"]

MODERNBERT_KEYS = ("local_attention", "global_attn_every_n_layers", "global_rope_theta", "local_rope_theta",
                   "classifier_pooling")
"""ModelConfig's keys that only ModernBERT has; the other architectures refuse a value other than the default."""


@dataclass
class ModelConfig:
    """The encoder; field names are transformers' own config names (RobertaConfig / BertConfig / ModernBertConfig).

    modernbert maps the shared names onto ModernBertConfig's: `intermediate_size` is the GeGLU width (its
    input projection is twice that), `hidden_act` its `hidden_activation`, `hidden_dropout_prob` its embedding
    and MLP dropout, `attention_probs_dropout_prob` its `attention_dropout`, `layer_norm_eps` its `norm_eps`.
    """

    architecture: Architecture = "roberta"
    init_from: str | None = None
    """Start from these weights (a hub name such as `roberta-base`, or an export folder) instead of random."""
    num_hidden_layers: int = 12
    hidden_size: int = 768
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    type_vocab_size: int | None = None
    """Segment vocabulary: None means 1 for RoBERTa, 2 for BERT."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2", "flex_attention"] = "sdpa"
    """transformers' attention kernel; doc-packed rows work with each (flex_attention: a BlockMask, no flash-attn)."""
    next_sentence_loss: bool = True
    """bert only: add the next-sentence-prediction loss (false: MLM alone on the same pairs data, RoBERTa §4.2)."""
    local_attention: int = 128
    """modernbert only: the sliding window of its local layers, in tokens (each token sees half of it either side)."""
    global_attn_every_n_layers: int = 3
    """modernbert only: every Nth layer (the first, then every N) attends globally, the others locally."""
    global_rope_theta: float = 160_000.0
    """modernbert only: the rotary base of the global layers."""
    local_rope_theta: float = 10_000.0
    """modernbert only: the rotary base of the local (sliding-window) layers."""
    classifier_pooling: Pooling = "mean"
    """modernbert only: what a sequence classifier fine-tuned from the export pools, the first token or the mean of
    the real tokens. Saved in the export's config, so fine-tuning and the hub follow it. `mean`: MLM never trains
    the first token's output, and a small, briefly pretrained model's `cls` feature then barely depends on the
    input (docs/benchmarks.md, pretraining gain)."""

    def __post_init__(self):
        # ≥ 1, and below size_limits' bounds: a typo must not allocate absurd memory.
        problems = lim.bound_problems([(f"model.{name}", getattr(self, name), limit) for name, limit in (
            ("num_hidden_layers", lim.MAX_LAYERS), ("num_attention_heads", lim.MAX_LAYERS),
            ("hidden_size", lim.MAX_MODEL_WIDTH), ("intermediate_size", lim.MAX_MODEL_WIDTH))])
        problems += lim.bound_problems([("model.type_vocab_size", self.type_vocab_size, lim.MAX_VOCAB)], minimum=0)
        add = problems.append
        if self.num_attention_heads >= 1 and self.hidden_size % self.num_attention_heads:
            add(f"model.hidden_size {self.hidden_size} is not divisible by model.num_attention_heads "
                f"{self.num_attention_heads}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0 <= getattr(self, name) < 1:
                add(f"model.{name}: must be in [0, 1), got {getattr(self, name)}")
        if self.architecture == "bert" and self.type_vocab_size is not None and self.type_vocab_size < 2:
            add(f"model.type_vocab_size: BERT's next-sentence task needs 2 segments, got {self.type_vocab_size}")
        if self.architecture != "bert" and not self.next_sentence_loss:
            add(f"model.next_sentence_loss: false applies to model.architecture bert only ({self.architecture} has "
                "no next-sentence head); leave it out")
        if self.attn_implementation == "flex_attention" and self.attention_probs_dropout_prob:
            # transformers' flex path raises at the first training step: FlexAttention has no attention dropout.
            add(f"model.attention_probs_dropout_prob: flex_attention has no attention dropout, got "
                f"{self.attention_probs_dropout_prob}; set it to 0 (ModernBERT's own default) or use another "
                "model.attn_implementation")
        refuse(self, problems + self._modernbert_problems())

    def _modernbert_problems(self) -> list[str]:
        """ModernBERT's own keys: in range for modernbert, left at their defaults (unused) for the others."""
        if self.architecture != "modernbert":
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            return [f"model.{key}: applies to model.architecture modernbert only ({self.architecture} has no such "
                    "setting); leave it out" for key in MODERNBERT_KEYS if getattr(self, key) != defaults[key]]
        problems = too_small("model", self, 1, "global_attn_every_n_layers")  # 1: every layer global
        if self.local_attention < 2 or self.local_attention % 2:
            problems.append(f"model.local_attention: the window must be an even number ≥ 2 of tokens (half on "
                            f"each side), got {self.local_attention}")
        for key in ("global_rope_theta", "local_rope_theta"):
            if getattr(self, key) <= 1:
                problems.append(f"model.{key}: a rotary base must be > 1, got {getattr(self, key)}")
        if self.type_vocab_size is not None:
            problems.append("model.type_vocab_size: modernbert has no segment embeddings; leave it out")
        heads, width = self.num_attention_heads, self.hidden_size
        if heads >= 1 and width % heads == 0 and (width // heads) % 2:
            problems.append(f"model.hidden_size / model.num_attention_heads = {width // heads}: rotary positions "
                            "need an even head size")
        return problems
