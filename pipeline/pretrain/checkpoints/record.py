"""What a checkpoint remembers: one typed, versioned record, its `complete.json`, written and read here only; and a
checkpoint as a run starts from it (`StartPoint`), checked against the run's config.

It holds the run as trained up to its step: the config, the model's shape, the batch of its last step,
the data stream's history (each corpus's layout and every stretch's batch, shares and starting draws:
stream.py) and the step ranges skipped. A resume follows the recorded stream even where today's config
or defaults differ (plan.py), and an export or a fine-tuning source reads the model's facts from it.

Version 1 (no `version` key) is the untyped marker of earlier releases: it still reads, without a stream
history. Version 3 marks bf16/fp16 checkpoints at ZeRO 0 holding fp32 weights and a plain torch optimizer; those
of versions 1-2 hold DeepSpeed's `FP16_UnfusedOptimizer` state, which checkpoints.py converts on load. Version 4
marks LAMB and StableAdamW state as step/optimizers.py keeps it (a step count per group, on the device), which an
earlier release's optimizers cannot read; it loads theirs. A record newer than `RECORD_VERSION` is refused by name
rather than half-read.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.errors import PipelineError
from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.common.run_layout import CHECKPOINT_RECORD_FILE
from pipeline.data.epoch_order import CorpusLayout

if TYPE_CHECKING:
    from pipeline.data.tokenizer import TokenizerInfo
    from pipeline.pretrain.config import PretrainConfig

RECORD_FILE = CHECKPOINT_RECORD_FILE
RECORD_VERSION = 4


@dataclass(frozen=True)
class StretchRecord:
    """Steps [start, end) at one global batch, drawing `shares` from corpora (by key) that had `first_draws`."""

    start: int
    end: int
    global_batch_size: int
    corpora: tuple[int, ...]
    shares: tuple[Fraction, ...]
    first_draws: tuple[int, ...]
    phase: str = ""


@dataclass(frozen=True)
class CheckpointRecord:
    step: int
    """Optimizer steps done (the 1-based number of the last one)."""
    config: dict[str, Any]
    """The config the run trained with, as a JSON tree (`config_tree.to_dict`)."""
    architecture: str
    seq_len: int
    zero_stage: int
    precision: str
    batch_plan: BatchPlan | None
    """The batch of the last step; its world size is the number of ranks that wrote the checkpoint."""
    hf_config: dict[str, Any] | None = None
    """The model's transformers config as built (an `init_from` folder's own shape)."""
    phase: str = ""
    corpora: tuple[CorpusLayout, ...] = ()
    stretches: tuple[StretchRecord, ...] = ()
    """The stream's history up to `step` (empty: a version-1 record, which kept none)."""
    skipped: tuple[tuple[int, int], ...] = ()
    """Step ranges A:B (1-based, inclusive, as the logs number steps) whose batches were left out."""
    sequences_seen: int = 0
    """Training sequences drawn by the first `step` steps, skipped ones included."""
    files: dict[str, dict[str, Any]] | None = None
    """{relative path: {"bytes", "sha256"}} of every other file of the checkpoint (None: saved without them)."""
    version: int = RECORD_VERSION

    @property
    def world_size(self) -> int | None:
        return self.batch_plan.world_size if self.batch_plan else None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["stretches"] = [{**asdict(s), "shares": [str(x) for x in s.shares]} for s in self.stretches]
        return out


SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
"""The model's shape: `model.*` keys that are also the HF config's names, so a checkpoint's `hf_config` holds them."""


# A checkpoint holds an optimizer's state, a model of one architecture and shape, and an embedding table of one
# vocabulary; loading it under a config that says otherwise fails deep inside DeepSpeed or torch (a StableAdamW
# state under AdamW: `KeyError: 'step'` at the first step), or trains on with the wrong vocabulary. `problems` reads
# only the record and names both sides of each mismatch.
@dataclass(frozen=True)
class StartPoint:
    """A complete checkpoint the run starts from: its own, or (`anneal`) the anneal's source, only read."""

    checkpoint: Path
    record: CheckpointRecord
    universal: bool
    """Written by another number of ranks: loaded through DeepSpeed's universal checkpoint (checkpoints/)."""
    anneal: bool = False

    @property
    def step(self) -> int:
        return self.record.step

    @classmethod
    def at(cls, folder: Path, record: CheckpointRecord, world_size: int, *, anneal: bool = False) -> StartPoint:
        """Starting from `folder` on `world_size` ranks: per-rank optimizer partitions load only on the number of
        ranks that wrote them, and through the universal checkpoint elsewhere."""
        universal = record.world_size != world_size and any(folder.glob("*optim_states.pt"))
        return cls(folder, record, universal, anneal)

    def problems(self, config: PretrainConfig, tokenizer: TokenizerInfo | None) -> list[str]:
        """The optimizer, architecture, vocabulary and shape this checkpoint was trained with, against `config` (each
        one its record holds: a version-1 record may lack some)."""
        record, checkpoint = self.record, self.checkpoint
        recorded, hf = record.config, record.hf_config or {}
        if not self.anneal:
            where = f"checkpoint.resume auto: this run's checkpoint {checkpoint}"
            fix = "a resume continues that run: set it back, or give this run another train.output_dir"
        else:
            where = f"train.anneal_from: checkpoint {checkpoint}"
            fix = "an anneal continues the checkpoint's model and optimizer: set it to the checkpoint's"
        problems = []
        optimizer = (recorded.get("optimizer") or {}).get("name")
        if optimizer is not None and optimizer != config.optimizer.name:
            problems.append(f"{where} was trained with optimizer {optimizer}; this config says "
                            f"{config.optimizer.name} (optimizer.name), whose state cannot be loaded from it; {fix}")
        if record.architecture != config.model.architecture:
            problems.append(f"{where} holds a {record.architecture} model; this config says "
                            f"{config.model.architecture} (model.architecture); {fix}")
        vocab = hf.get("vocab_size")
        if tokenizer is not None and vocab is not None and vocab != tokenizer.vocab_size:
            problems.append(f"{where} has a vocabulary of {vocab} tokens; data.tokenizer {config.data.tokenizer} "
                            f"has {tokenizer.vocab_size}; train with the tokenizer the checkpoint was trained with")
        if record.architecture == config.model.architecture and not config.model.init_from:  # init_from: its shape
            for key in SHAPE_KEYS:
                saved = hf.get(key)
                if saved is not None and saved != getattr(config.model, key):
                    problems.append(f"{where} has {key} {saved}; this config says {getattr(config.model, key)} "
                                    f"(model.{key}); {fix}")
        return problems


def write_record(folder: Path, record: CheckpointRecord) -> None:
    """Write `folder`'s record atomically: the checkpoint is complete once it exists."""
    write_json_atomic(folder / RECORD_FILE, record.to_json())


def read_record(folder: Path) -> CheckpointRecord:
    """`folder`'s record; a damaged one, or one newer than this release reads, is a PipelineError naming it."""
    path = folder / RECORD_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PipelineError(f"checkpoint {folder}: {RECORD_FILE} is damaged ({err}); it cannot be used") from None
    if not isinstance(data, dict):
        raise PipelineError(f"checkpoint {folder}: {RECORD_FILE} is damaged (not a JSON object)")
    version = data.get("version", 1)
    if not isinstance(version, int) or version > RECORD_VERSION:
        raise PipelineError(f"checkpoint {folder}: its {RECORD_FILE} is record version {version}, newer than the "
                            f"{RECORD_VERSION} this roberta-pipeline reads; upgrade roberta-pipeline to use it")
    try:
        return _from_json(data) if version >= 2 else _from_version_1(data)
    except (KeyError, TypeError, ValueError) as err:
        raise PipelineError(f"checkpoint {folder}: {RECORD_FILE} is damaged (missing or malformed {err})") from None


def _from_json(data: dict[str, Any]) -> CheckpointRecord:
    values = dict(data)
    values["batch_plan"] = BatchPlan(**data["batch_plan"]) if data.get("batch_plan") else None
    values["corpora"] = tuple(CorpusLayout(**{**c, "shard_sizes": tuple(c["shard_sizes"])}) for c in data["corpora"])
    values["stretches"] = tuple(StretchRecord(**{**s, "corpora": tuple(s["corpora"]),
                                                 "shares": tuple(Fraction(x) for x in s["shares"]),
                                                 "first_draws": tuple(s["first_draws"])}) for s in data["stretches"])
    values["skipped"] = tuple(tuple(r) for r in data["skipped"])
    return CheckpointRecord(**values)


def _from_version_1(data: dict[str, Any]) -> CheckpointRecord:
    """The untyped marker of earlier releases: the model's facts and the step, no stream history."""
    state = data.get("train_state") or {}
    plan = data.get("batch_plan") or {}
    return CheckpointRecord(
        step=int(data["step"]), config=data.get("config") or {}, architecture=data.get("architecture", "roberta"),
        seq_len=int(data.get("seq_len", 0)), zero_stage=int(data.get("zero_stage", 0)),
        precision=data.get("precision", "fp32"),
        batch_plan=BatchPlan(**plan) if set(plan) == {f.name for f in fields(BatchPlan)} else None,
        hf_config=data.get("hf_config"), phase=data.get("phase") or state.get("phase", ""),
        sequences_seen=int(state.get("samples_consumed", 0)), files=data.get("files"), version=1)

