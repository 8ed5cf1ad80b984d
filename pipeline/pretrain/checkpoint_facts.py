"""What an export needs to know of a checkpoint, read in one place: its step, data seen, config and validation loss.

`checkpoint_facts` is the one reader of a checkpoint's completion marker and of its run's `metrics.jsonl`
for the export, the model card and the revision index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.common.config_tree import build_config
from pipeline.common.errors import PipelineError
from pipeline.common.fingerprints import checkpoint_fingerprint
from pipeline.common.run_layout import PretrainLayout
from pipeline.pretrain.checkpoints import read_marker
from pipeline.pretrain.config import PretrainConfig


@dataclass(frozen=True)
class CheckpointFacts:
    folder: Path
    step: int
    """Optimizer steps trained."""
    samples_consumed: int
    """Training sequences drawn by those steps."""
    tokens_seen: int | None
    """Token positions trained on: each sequence's length summed over the sequences drawn (padding included);
    None when a phase's shard folder cannot be read to give its length."""
    architecture: str
    precision: str
    zero_stage: int
    seq_len: int
    """The sequence length of the phase that trained the last step."""
    config: PretrainConfig
    hf_config: dict[str, Any] | None
    """The trained model's transformers config as built (None: a checkpoint written before markers held it)."""
    fingerprint: str
    validation: dict[str, float]
    """The last evaluation at or before `step` in the run's metrics.jsonl (`step`, `eval/mlm_loss`,
    `eval/unigram_entropy`, …); empty for a loose checkpoint or a run that never evaluated."""
    run: PretrainLayout | None
    """The run folder holding the checkpoint (None: a loose checkpoint)."""


def checkpoint_facts(checkpoint: Path) -> CheckpointFacts:
    """Read a complete checkpoint's marker and its run's validation record."""
    marker = read_marker(checkpoint)
    config, problems = build_config(PretrainConfig, marker.get("config") or {})
    if problems:
        raise PipelineError(f"checkpoint {checkpoint}: the config in its marker no longer reads: "
                            + "; ".join(problems))
    state = marker.get("train_state") or {}
    step = int(marker["step"])
    samples = int(state.get("samples_consumed", step * config.train.global_batch_size))
    run = PretrainLayout.of_checkpoint(checkpoint)
    return CheckpointFacts(
        folder=checkpoint, step=step, samples_consumed=samples,
        tokens_seen=_tokens_seen(config, step, samples, int(marker["seq_len"])),
        architecture=marker["architecture"], precision=marker.get("precision", config.train.precision),
        zero_stage=int(marker["zero_stage"]), seq_len=int(marker["seq_len"]), config=config,
        hf_config=marker.get("hf_config"), fingerprint=checkpoint_fingerprint(marker),
        validation=_last_evaluation(run.metrics, step) if run else {}, run=run)


def _tokens_seen(config: PretrainConfig, step: int, samples: int, seq_len: int) -> int | None:
    """Sequences × their length; with phases each phase's steps at its own batch and its folder's length."""
    if not config.phases:
        return samples * seq_len
    from pipeline.data.shard_index import load_index
    from pipeline.pretrain.phases import resolve_phases

    total = 0
    for phase in resolve_phases(config):
        steps = max(0, min(step, phase.end) - phase.start)
        try:
            length = phase.seq_len or load_index(phase.data.corpora()[0].path)["seq_len"]
        except PipelineError:
            return None
        total += steps * phase.global_batch_size * length
    return total


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
