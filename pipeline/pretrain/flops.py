"""Training FLOPs per token of an encoder, for the MFU estimate and the sparse-head prediction.

Counts matrix multiplies only (2 FLOPs per multiply-add; backward = 2× forward, so ×3 in all):
per layer 4·H² (attention projections) + 2·H·I (feed-forward) per token, plus the attention
scores and weighted sum, 2·S·H per token; the MLM head's H² + H·V runs on every token for a dense
head and on the masked fraction for the sparse one.
"""

from __future__ import annotations


def training_flops_per_token(*, layers: int, hidden: int, intermediate: int, seq_len: int, vocab: int,
                             masked_fraction: float | None) -> float:
    """Forward + backward FLOPs per input token; `masked_fraction=None` means a dense (full-logit) head."""
    body = layers * (4 * hidden * hidden + 2 * hidden * intermediate + 2 * seq_len * hidden)
    head = hidden * hidden + hidden * vocab
    head_share = 1.0 if masked_fraction is None else masked_fraction
    return 3 * 2 * (body + head_share * head)


def mfu(tokens_per_second: float, flops_per_token: float, peak_tflops: float | None, devices: int) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the devices' peak (None when no peak is configured)."""
    if not peak_tflops:
        return None
    return tokens_per_second * flops_per_token / (peak_tflops * 1e12 * devices)
