"""Whether a saved model computes what the in-memory model computed: the proof an export or a saved model carries.

The same batch goes through the model as it was trained (its own forward, precision and attention) and
through the saved folder loaded by transformers' Auto classes. Conversions fail their users in silent
ways: a weight left untied or tied wrongly loads random values, an offset position table shifts every
embedding, a config field lost on the way gives NaN or merely different logits. Any of those moves the
logits far more than the precision does, so the largest difference is held to a tolerance fit for the
precision the reference ran in, and a folder beyond it is refused.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from pipeline.common.errors import PipelineError
from pipeline.models.precision import Precision

RELATIVE_TOLERANCE: dict[str, float] = {"fp32": 1e-4, "bf16": 6e-2, "fp16": 1e-2}
"""The largest logit difference allowed, as a share of the reference logits' largest magnitude (at least 1).

fp32 against fp32 differs only by kernels and summation order; a bf16 reference rounds every activation to
8 bits of mantissa, fp16 to 11. Measured on the CPU with 2-layer models of the four architectures: 0 in
fp32; 0.004–0.008 in bf16 at random initialisation and 0.012 after 40 bf16 steps; 0.0006–0.001 in fp16. A
wrong tie or a shifted position moves the logits by about their own scale (0.65–1.1 on those models).
"""

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Agreement:
    """One batch through both paths: what was compared and how far apart the logits were."""

    max_logit_difference: float
    """The largest |reference − saved| over every compared logit (inf when either has a NaN or an inf)."""
    top1_agreement: float
    """The share of compared positions whose highest logit is the same class or token in both."""
    tolerance: float
    """The largest difference allowed: `RELATIVE_TOLERANCE[precision]` × max(1, the reference's largest |logit|)."""
    precision: str
    """The precision the reference ran in (the saved folder loads in fp32)."""
    compared: int
    """Positions (masked tokens, examples or tokens) whose logits were compared."""
    reference: str
    """The path the reference took, in words (its head, rows, attention)."""

    @property
    def within_tolerance(self) -> bool:
        return self.max_logit_difference <= self.tolerance

    def record(self) -> dict:
        return {**asdict(self), "within_tolerance": self.within_tolerance}


def compare_logits(reference: torch.Tensor | list[torch.Tensor], saved: torch.Tensor | list[torch.Tensor],
                   precision: Precision, description: str) -> Agreement:
    """Compare logits of the same positions (…, classes) from both paths; several heads' outputs as lists."""
    reference = [t.detach().float().cpu() for t in (reference if isinstance(reference, list) else [reference])]
    saved = [t.detach().float().cpu() for t in (saved if isinstance(saved, list) else [saved])]
    for a, b in zip(reference, saved, strict=True):
        if a.shape != b.shape:
            raise PipelineError(f"the saved model's logits have shape {tuple(b.shape)}, the model's own "
                                f"{tuple(a.shape)}: it does not compute the same outputs")
    finite = all(bool(torch.isfinite(t).all()) for t in [*reference, *saved])
    difference = max(float((a - b).abs().max()) if a.numel() else 0.0 for a, b in zip(reference, saved, strict=True))
    scale = max([1.0, *(float(a.abs().max()) for a in reference if a.numel() and finite)])
    agree = [(a.argmax(-1) == b.argmax(-1)).flatten() for a, b in zip(reference, saved, strict=True) if a.numel()]
    same = torch.cat(agree) if agree else torch.ones(0, dtype=torch.bool)
    return Agreement(max_logit_difference=difference if finite else math.inf,
                     top1_agreement=float(same.float().mean()) if len(same) else 1.0,
                     tolerance=RELATIVE_TOLERANCE[precision] * scale, precision=precision,
                     compared=int(reference[0].shape[:-1].numel()) if reference[0].ndim > 1 else 1,
                     reference=description)


def refuse_unless_within(agreement: Agreement, what: str) -> None:
    """Stop with the figures when the saved model does not compute what the model did."""
    if agreement.within_tolerance:
        return
    a = agreement
    raise PipelineError(
        f"{what} refused: the saved folder, loaded with transformers' Auto classes, does not compute what the "
        f"model computed. On one batch ({a.compared} positions; reference: {a.reference}, {a.precision}) the "
        f"largest logit difference is {a.max_logit_difference:.3g}, over the tolerance {a.tolerance:.3g} for "
        f"{a.precision}; top-1 agreement {a.top1_agreement:.1%}. A weight tied or untied on the way, a shifted "
        f"position table, a config field lost in the conversion, or NaN logits cause this")
