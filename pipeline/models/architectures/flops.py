"""Training FLOPs per token of an encoder, for the MFU estimate and the sparse-head prediction.

Counts matrix multiplies only (2 FLOPs per multiply-add; backward = 2× forward, so ×3 in all):
per layer 4·H² (attention projections) + 2·H·I (feed-forward) per token, plus the attention
scores and weighted sum, 2·K·H per token for K keys per query (K = S for global attention); the
MLM head's H² + H·V runs on every token for a dense head and on the masked fraction for the
sparse one.

ModernBERT differs in two places, counted as the model defines them:
- GeGLU: its input projection is H × 2I (value and gate), so the feed-forward is 3·H·I, not 2·H·I;
- local layers: a query sees at most `local_attention + 1` keys (`|i - j| ≤ local_attention / 2`),
  fewer at a sequence's edges; K is the mean over the positions of a sequence of `seq_len`.
  These are the model's FLOPs: SDPA with a mask (CPU) still computes all S × S scores, so on CPU
  the local layers do more work than counted, and their MFU is an honest lower bound.
"""

from __future__ import annotations


def mean_keys_per_query(seq_len: int, half_window: int | None) -> float:
    """Keys a query attends to, averaged over the positions of a sequence (all of them without a window)."""
    if half_window is None or half_window >= seq_len - 1:
        return float(seq_len)
    total = sum(min(seq_len - 1, i + half_window) - max(0, i - half_window) + 1 for i in range(seq_len))
    return total / seq_len


def training_flops_per_token(*, layers: int, hidden: int, intermediate: int, seq_len: int, vocab: int,
                             masked_fraction: float | None, glu: bool = False, local_layers: int = 0,
                             half_window: int | None = None) -> float:
    """Forward + backward FLOPs per input token; `masked_fraction=None` means a dense (full-logit) head.

    `glu`: a gated feed-forward (GeGLU); `local_layers` of the `layers` attend within `half_window`
    positions either side.
    """
    feed_forward = (3 if glu else 2) * hidden * intermediate
    global_layers = layers - local_layers
    scores = 2 * hidden * (global_layers * seq_len + local_layers * mean_keys_per_query(seq_len, half_window))
    body = layers * (4 * hidden * hidden + feed_forward) + scores
    head = hidden * hidden + hidden * vocab
    head_share = 1.0 if masked_fraction is None else masked_fraction
    return 3 * 2 * (body + head_share * head)


def model_flops_per_token(hf_config, seq_len: int, masked_fraction: float | None) -> float:
    """`training_flops_per_token` for a transformers config of any of the pipeline's architectures."""
    c = hf_config
    shape = dict(layers=c.num_hidden_layers, hidden=c.hidden_size, intermediate=c.intermediate_size,
                 seq_len=seq_len, vocab=c.vocab_size, masked_fraction=masked_fraction)
    if c.model_type == "modernbert":
        local = sum(kind == "sliding_attention" for kind in c.layer_types)
        return training_flops_per_token(**shape, glu=True, local_layers=local, half_window=c.sliding_window)
    return training_flops_per_token(**shape)


def mfu(tokens_per_second: float, flops_per_token: float, peak_tflops: float | None, devices: int) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the devices' peak (None when no peak is configured)."""
    if not peak_tflops:
        return None
    return tokens_per_second * flops_per_token / (peak_tflops * 1e12 * devices)
