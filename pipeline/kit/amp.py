"""`AMPTrainer`: a mixed-precision training step for any HF model that returns a loss (MLM or classification).

The engine is accelerate's, the same as fine-tuning's (`pipeline.finetune.loop.accelerator`): bf16 or
fp16 autocast, and for fp16 a gradient scaler (its narrow exponent range underflows small
gradients; bf16 has fp32's range and needs none). Gradients are accumulated over
`accumulation_steps` micro batches, unscaled, clipped to `max_grad_norm`, then the optimizer and
scheduler step. Runs on CPU (bf16; torch's CPU autocast) and GPU.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from pipeline.common.errors import PipelineError
from pipeline.finetune.loop.accelerator import build_accelerator
from pipeline.models.precision import PRECISIONS, Precision


class AMPTrainer:
    """Steps `model` with `optimizer` on batches of tensors (dicts with `labels`); call `step` per micro batch."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, precision: Precision = "bf16",
                 device: str | torch.device | None = None, accumulation_steps: int = 1,
                 max_grad_norm: float | None = 1.0, scheduler=None):
        if precision not in PRECISIONS:
            raise PipelineError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if accumulation_steps < 1:
            raise PipelineError(f"accumulation_steps must be at least 1, got {accumulation_steps}")
        cpu = torch.device(device).type == "cpu" if device is not None else not torch.cuda.is_available()
        if not cpu and not torch.cuda.is_available():
            raise PipelineError(f"device {device!r}: no GPU is available here; use device='cpu'")
        if precision == "fp16" and cpu:
            raise PipelineError("precision fp16 needs a GPU (its gradient scaler runs on CUDA); use bf16 on a CPU")
        self.accelerator = build_accelerator(precision, accumulation=accumulation_steps, cpu=cpu)
        prepared = self.accelerator.prepare(model, optimizer, *([scheduler] if scheduler is not None else []))
        self.model, self.optimizer = prepared[0], prepared[1]
        self.scheduler = prepared[2] if scheduler is not None else None
        self.device = self.accelerator.device
        self.precision, self.accumulation_steps, self.max_grad_norm = precision, accumulation_steps, max_grad_norm
        self.micro_step = 0
        self.optimizer_steps = 0
        self.last_grad_norm: float | None = None

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """fp16's gradient scaler (None in bf16 and fp32)."""
        return self.accelerator.scaler

    def autocast(self):
        """The autocast context of this trainer's precision (a no-op in fp32); use it for evaluation too."""
        return self.accelerator.autocast()

    def step(self, batch: dict[str, torch.Tensor]) -> float:
        """Forward and backward one micro batch; the optimizer steps every `accumulation_steps` calls. The loss."""
        self.model.train()
        batch = {k: v.to(self.device) for k, v in batch.items()}
        with self.accelerator.accumulate(self.model):
            with self.autocast():
                loss = self.model(**batch).loss
            # accelerate divides by the accumulation steps, so the sum over micro batches is their mean.
            self.accelerator.backward(loss.float())
            if self.accelerator.sync_gradients:
                if self.max_grad_norm:  # on the true gradients: accelerate unscales fp16's first
                    self.last_grad_norm = float(self.accelerator.clip_grad_norm_(self.model.parameters(),
                                                                                 self.max_grad_norm))
                self.optimizer_steps += 1
            self.optimizer.step()  # a no-op between accumulation boundaries; skipped on an fp16 overflow
            if self.scheduler is not None:
                self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.micro_step += 1
        return loss.item()

    def train_epoch(self, loader: Iterable[dict[str, torch.Tensor]]) -> float:
        """One pass over `loader`; returns the mean micro-batch loss."""
        losses = [self.step(batch) for batch in loader]
        if not losses:
            raise PipelineError("the loader yielded no batches")
        return sum(losses) / len(losses)
