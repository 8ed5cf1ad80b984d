"""`AMPTrainer`: a mixed-precision training step for any HF model that returns a loss (MLM or classification).

bf16 or fp16 autocast; fp16 scales the loss with a `GradScaler` (its narrow exponent range
underflows small gradients; bf16 has fp32's range and needs none). Gradients are accumulated over
`accumulation_steps` micro batches, unscaled, clipped to `max_grad_norm`, then the optimizer and
scheduler step. Runs on CPU (bf16; torch's CPU autocast) and GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch

from pipeline.common.errors import PipelineError

Precision = Literal["bf16", "fp16", "fp32"]
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class AMPTrainer:
    """Steps `model` with `optimizer` on batches of tensors (dicts with `labels`); call `step` per micro batch."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, precision: Precision = "bf16",
                 device: str | torch.device | None = None, accumulation_steps: int = 1,
                 max_grad_norm: float | None = 1.0, scheduler=None):
        if precision not in ("bf16", "fp16", "fp32"):
            raise PipelineError(f"precision must be bf16, fp16 or fp32, got {precision!r}")
        if accumulation_steps < 1:
            raise PipelineError(f"accumulation_steps must be at least 1, got {accumulation_steps}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = model.to(self.device)
        self.optimizer, self.scheduler = optimizer, scheduler
        self.precision, self.accumulation_steps, self.max_grad_norm = precision, accumulation_steps, max_grad_norm
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision == "fp16")
        self.micro_step = 0
        self.optimizer_steps = 0
        self.last_grad_norm: float | None = None

    def autocast(self):
        """The autocast context of this trainer's precision (a no-op in fp32); use it for evaluation too."""
        return torch.autocast(self.device.type, dtype=_DTYPES.get(self.precision, torch.float32),
                              enabled=self.precision != "fp32")

    def step(self, batch: dict[str, torch.Tensor]) -> float:
        """Forward and backward one micro batch; the optimizer steps every `accumulation_steps` calls. The loss."""
        self.model.train()
        batch = {k: v.to(self.device) for k, v in batch.items()}
        with self.autocast():
            loss = self.model(**batch).loss
        # Each micro batch carries 1/accumulation of the gradient, so the sum is the mean over them.
        self.scaler.scale(loss.float() / self.accumulation_steps).backward()
        self.micro_step += 1
        if self.micro_step % self.accumulation_steps == 0:
            self._optimizer_step()
        return loss.item()

    def _optimizer_step(self) -> None:
        self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
        if self.max_grad_norm:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            self.last_grad_norm = float(norm)
        self.scaler.step(self.optimizer)  # skipped by the scaler when fp16 gradients overflowed
        self.scaler.update()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1

    def train_epoch(self, loader: Iterable[dict[str, torch.Tensor]]) -> float:
        """One pass over `loader`; returns the mean micro-batch loss."""
        losses = [self.step(batch) for batch in loader]
        if not losses:
            raise PipelineError("the loader yielded no batches")
        return sum(losses) / len(losses)
