"""Changing a ModernBERT's RoPE theta in place gives the model that was built with it: config and rotary buffers."""

from __future__ import annotations

import pytest
import torch
from transformers import ModernBertConfig, ModernBertForMaskedLM

from pipeline.models.architectures.hf_model import rope_thetas, set_rope_theta


def tiny(global_theta: float) -> ModernBertForMaskedLM:
    torch.manual_seed(0)
    config = ModernBertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                              intermediate_size=32, max_position_embeddings=64, local_attention=8,
                              initializer_range=0.5,  # sharp attention, so positions show in the logits
                              global_rope_theta=global_theta, local_rope_theta=10_000.0, pad_token_id=0,
                              bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    return ModernBertForMaskedLM(config).eval()


def test_a_raised_theta_reaches_the_config_and_the_rotary_buffers():
    model, reference = tiny(10_000.0), tiny(160_000.0)
    ids = torch.randint(3, 64, (2, 48))
    before = model(input_ids=ids).logits
    assert set_rope_theta(model, 160_000.0, 10_000.0)
    assert rope_thetas(model) == {"global": 160_000.0, "local": 10_000.0}
    ours, theirs = model.model.rotary_emb, reference.model.rotary_emb
    for name in ("full_attention_inv_freq", "full_attention_original_inv_freq", "sliding_attention_inv_freq"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    after = model(input_ids=ids).logits
    assert torch.allclose(after, reference(input_ids=ids).logits, atol=1e-6)  # the same weights: the same model
    assert not torch.allclose(after, before, atol=1e-4)  # and the theta matters at 48 positions
    assert ModernBertConfig.from_dict(model.config.to_dict()).rope_parameters["full_attention"]["rope_theta"] == \
        160_000.0
    assert not set_rope_theta(model, 160_000.0, 10_000.0)  # nothing left to change


def test_a_model_without_rotary_positions_is_refused():
    with pytest.raises(ValueError, match="has no ModernBERT rotary embedding"):
        set_rope_theta(torch.nn.Linear(2, 2), 1e5, 1e4)
