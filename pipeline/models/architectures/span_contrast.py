"""The span-contrastive term of pretraining (coCondenser's span loss, Contriever's crops), on the MLM forward's own
hidden states.

The batch names two spans of each of up to S documents in `span_ids` (int64, (2, rows, seq_len)): in view v, a
token of document slot d's span holds d, every other token -1 (pretrain/batches/span_sampler.py draws them). Each
span is mean-pooled from the last hidden states the MLM head reads, L2-normalised, and the two views meet in a
symmetric in-batch InfoNCE: span a of document d must pick span b of d among the spans b of every document.

Nothing is read back to the host: pooling is a matrix product with a one-hot built by comparison (no `nonzero`, no
boolean indexing, shapes fixed by `span_ids`' shape; a product, unlike `index_add_` on a GPU, sums in a fixed
order, so a resumed run repeats the same losses), and an empty document slot (length 0) is masked out of the
logits rather than dropped. A micro batch with fewer than two documents contributes exactly 0: a row whose only
candidate is its own positive has a cross-entropy of 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

MASKED_LOGIT = -1e9
"""The similarity given to an empty document slot: exp() of it is 0 beside any real one."""


@dataclass(frozen=True)
class SpanContrast:
    """The span loss's settings (the pretraining config's `contrastive` section) and its computation."""

    weight: float
    """λ in loss = MLM + λ · span loss."""
    temperature: float
    """The InfoNCE temperature dividing the cosine similarities."""
    documents_per_row: int = 1
    """Document slots S of a micro batch per row: `span_ids` of `rows` rows holds slot numbers 0 … rows × this − 1."""

    def pool(self, hidden: torch.Tensor, span_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(each span's mean hidden state, (2, S, H) float32; each span's token count, (2, S)) from `hidden`
        (rows, seq_len, H) and `span_ids` (2, rows, seq_len)."""
        slots = torch.arange(span_ids.shape[1] * self.documents_per_row, device=span_ids.device)
        member = (span_ids.flatten(1)[..., None] == slots).to(hidden.dtype)  # (2, rows·seq_len, S), one-hot or 0
        sums = torch.einsum("vts,th->vsh", member, hidden.flatten(0, 1)).float()
        counts = member.float().sum(1)
        return sums / counts.clamp(min=1)[..., None], counts

    def loss(self, hidden: torch.Tensor, span_ids: torch.Tensor) -> torch.Tensor:
        """The symmetric InfoNCE of the two views' spans, averaged over the documents present (0 below two)."""
        means, counts = self.pool(hidden, span_ids)
        with torch.autocast(hidden.device.type, enabled=False):  # cosines / 0.05 in float32, not at bf16's 3 digits
            a, b = F.normalize(means, dim=-1).unbind(0)
            present = counts[0] > 0
            both = present[:, None] & present[None, :]
            logits = (a @ b.T / self.temperature).masked_fill(~both, MASKED_LOGIT)
            targets = torch.arange(len(logits), device=logits.device)
            per_document = (F.cross_entropy(logits, targets, reduction="none")
                            + F.cross_entropy(logits.T, targets, reduction="none")) / 2
            return (per_document * present).sum() / present.sum().clamp(min=1)

    def losses(self, mlm: torch.Tensor, hidden: torch.Tensor, span_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The training forward's return: the weighted sum as `loss`, and both terms."""
        span = self.loss(hidden, span_ids)
        return {"loss": mlm + self.weight * span, "mlm_loss": mlm, "span_loss": span}
