"""The one precision vocabulary of pretraining, fine-tuning and the Kit: `fp32 | bf16 | fp16`."""

from __future__ import annotations

from typing import Literal, get_args

Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)


def accelerate_precision(precision: Precision) -> str:
    """accelerate's name for a precision (it calls fp32 "no")."""
    return "no" if precision == "fp32" else precision
