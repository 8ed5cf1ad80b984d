"""What an export needs to know of a checkpoint: its record's facts (checkpoint_record.py), the config rebuilt,
the tokens its stream drew, and its run's last validation loss (metrics.jsonl), for the export, the model card
and the revision index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.common.config.tree import build_config
from pipeline.common.errors import PipelineError
from pipeline.common.run_layout import PretrainLayout
from pipeline.models.fingerprints import checkpoint_fingerprint
from pipeline.pretrain.checkpoints.record import CheckpointRecord
from pipeline.pretrain.checkpoints.storage import verified_checkpoint
from pipeline.pretrain.config import PretrainConfig


@dataclass(frozen=True)
class CheckpointFacts:
    folder: Path
    step: int
    """Optimizer steps trained."""
    samples_consumed: int
    """Training sequences drawn by those steps."""
    tokens_seen: int
    """Token positions trained on: each sequence's length summed over the sequences drawn (padding included)."""
    architecture: str
    precision: str
    zero_stage: int
    seq_len: int
    """The sequence length of the phase that trained the last step."""
    config: PretrainConfig
    hf_config: dict[str, Any] | None
    """The trained model's transformers config as built (None: a checkpoint written before records held it)."""
    fingerprint: str
    validation: dict[str, float]
    """The last evaluation at or before `step` in the run's metrics.jsonl (`step`, `eval/mlm_loss`,
    `eval/unigram_entropy`, …); empty for a loose checkpoint or a run that never evaluated."""
    run: PretrainLayout | None
    """The run folder holding the checkpoint (None: a loose checkpoint)."""

    @property
    def tokenizer(self) -> Path | str:
        """The run's own copy of the tokenizer; for a loose checkpoint, the one its config names."""
        own_copy = self.run.tokenizer if self.run and self.run.tokenizer.is_dir() else None
        return own_copy or self.config.data.tokenizer

    @property
    def phase(self):
        """The phase that trained the checkpoint's last step (past the end: an anneal's, the last)."""
        from pipeline.pretrain.plan.phases import resolve_phases

        phases = resolve_phases(self.config)
        return next((p for p in phases if p.start < self.step <= p.end), phases[-1])


def checkpoint_facts(path: str | Path) -> CheckpointFacts:
    """A complete, intact checkpoint (or a run's newest: `verified_checkpoint`), its record's facts and its run's
    validation record."""
    checkpoint, record = verified_checkpoint(path)
    config, problems = build_config(PretrainConfig, record.config)
    if problems:
        raise PipelineError(f"checkpoint {checkpoint}: the config in its record no longer reads: "
                            + "; ".join(problems))
    run = PretrainLayout.of_checkpoint(checkpoint)
    return CheckpointFacts(
        folder=checkpoint, step=record.step, samples_consumed=record.sequences_seen,
        tokens_seen=_tokens_seen(record), architecture=record.architecture, precision=record.precision,
        zero_stage=record.zero_stage, seq_len=record.seq_len, config=config, hf_config=record.hf_config,
        fingerprint=checkpoint_fingerprint(record),
        validation=_last_evaluation(run.metrics, record.step) if run else {}, run=run)


def _tokens_seen(record: CheckpointRecord) -> int:
    """Sequences × their length, each stretch of the stream at its own batch and its corpora's length."""
    if not record.stretches:  # a version-1 record kept no stream: its last sequence length for all
        return record.sequences_seen * record.seq_len
    length = {c.key: c.seq_len for c in record.corpora}
    return sum((s.end - s.start) * s.global_batch_size * length[s.corpora[0]] for s in record.stretches)


def _last_evaluation(metrics: Path, step: int) -> dict[str, float]:
    last: dict[str, float] = {}
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except OSError:
        return last
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if isinstance(record, dict) and "eval/mlm_loss" in record and record.get("step", 0) <= step:
            if record["step"] >= last.get("step", -1):
                last = {k: v for k, v in record.items() if k == "step" or k.startswith("eval/")}
    return last
