"""The export's proof: one validation batch through the training-time model and through the exported folder.

The training path is what the run optimised, rebuilt as the trainer built it: the training class from the
run's config (`build_model`, the phase's RoPE bases; a `model.init_from` run from the shape its record keeps,
the folder's), holding the checkpoint's weights, its `masked_logits` (the MLM head at the batch's masked
slots, the real ones kept) and its loss as the engine computes it in evaluation, on the batch as
`MaskedBatches` made it (doc-packed rows with positions restarting per document and attention kept inside
each; padded rows with their mask; BERT's segment pairs). It runs in fp32 whatever the run trained in: its
weights are the fp32 master weights, and a bf16 forward's rounding would hide a wrong weight (a LayerNorm
reset on the way out moved a test model's logits by 0.013-0.016, inside the 0.06 that bf16's rounding needs).
The exported path is what a user gets: `AutoModelForMaskedLM.from_pretrained(folder)` in fp32, fed each
document as a row of its own, padded, with the positions transformers computes itself, and the folder's own
tokenizer.

Three things must agree: the masked positions' logits (`pipeline/models/output_agreement.py`, fp32's
tolerance), the MLM loss on the batch (to the same share of its size), and the exported tokenizer's
fingerprint with the one the run's shards were made with. Since the reference comes from the config and the
exported folder from the checkpoint's recorded transformers config, a recorded config that lost or changed a
field is refused too.

The check runs on the CPU. A run that trained with FlashAttention-2 or FlexAttention is replayed with SDPA
and the same document mask (the kernels compute the same attention); the record names the kernel used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from pipeline.common.errors import PipelineError
from pipeline.data.tokenizer import TokenizerInfo
from pipeline.models.output_agreement import RELATIVE_TOLERANCE, Agreement, compare_logits, refuse_unless_within
from pipeline.pretrain.batches.masked_slots import dense_labels
from pipeline.pretrain.export.facts import CheckpointFacts
from pipeline.pretrain.plan.masking import EVAL_STREAM, IGNORE_INDEX

if TYPE_CHECKING:
    from pipeline.models.architectures.config import ModelConfig
    from pipeline.pretrain.plan.phases import Phase

CHECK_ROWS = 8
"""Validation sequences in the checked batch (the first ones, as the run's evaluation takes them)."""

CPU_ATTENTION = ("sdpa", "eager")
"""Attention kernels the check replays as the run used them; others are replayed with SDPA."""


class _FirstRows:
    """The first `rows` sequences of a shard folder's validation split, as `MaskedBatches` reads a cache."""

    def __init__(self, folder: str, rows: int):
        from pipeline.data.shards.reader import ShardedDataset

        try:
            split = ShardedDataset(folder, "val")
            first = [split[i] for i in range(min(rows, len(split)))]
        except PipelineError as err:
            raise PipelineError(f"the export is checked on the run's validation shards, which cannot be read: {err}. "
                                "Restore the shard folder the run's config names") from None
        if not first:
            raise PipelineError(f"{folder}: no validation sequences to check the export on (shard with "
                                "--val-fraction above 0)")
        self.fields = {name: np.stack([row[name] for row in first]) for name in first[0]}

    def __len__(self) -> int:
        return len(self.fields["input_ids"])


def validation_batch(facts: CheckpointFacts, tokenizer, info: TokenizerInfo) -> dict[str, torch.Tensor]:
    """The first validation micro batch of the phase that trained the checkpoint's last step (of a mix, its first
    corpus's), masked as the run's evaluation masks it."""
    from pipeline.models.architectures.hf_model import first_position_id
    from pipeline.pretrain.batches.stretch_data import MaskedBatches, MicroBatchKey
    from pipeline.pretrain.plan.masking import build_masker

    c = facts.config
    rows = _FirstRows(facts.phase.data.corpora()[0].path, CHECK_ROWS)
    masker = build_masker(c.masking, tokenizer, info.vocab_size, info.mask_id, c.train.seed, evaluation=True)
    batches = MaskedBatches(rows, masker, with_segments=facts.architecture == "bert",
                            position_offset=first_position_id(facts.architecture, info.pad_id))
    return batches[MicroBatchKey(0, np.arange(len(rows)), EVAL_STREAM)]


def trained_seq_len(facts: CheckpointFacts) -> int:
    """The sequence length the trainer sized positions for: the longest of the shard folders the config names
    (those still readable), at least the checkpoint's own."""
    from pipeline.data.shards.index import load_index
    from pipeline.pretrain.plan.phases import resolve_phases

    lengths = [facts.seq_len]
    for source in {s.path for p in resolve_phases(facts.config) for s in p.data.corpora()}:
        try:
            lengths.append(int(load_index(source)["seq_len"]))
        except PipelineError:
            continue  # a folder no longer here: the validation batch's own is needed, and named, later
    return max(lengths)


def training_path(facts: CheckpointFacts, hf_config: dict, state: dict[str, torch.Tensor], info: TokenizerInfo,
                  batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, float, str]:
    """The masked positions' logits and the MLM loss from the training class on the run's path, in fp32; and that
    path in words."""
    trained_with = facts.config.model.attn_implementation
    attention = trained_with if trained_with in CPU_ATTENTION else "sdpa"
    try:
        model = training_model(facts.config.model, hf_config, info, trained_seq_len(facts), facts.phase, state,
                               attention, facts.folder)
    except RuntimeError as err:  # a tensor of another shape than the config's model has
        raise PipelineError(f"the export of {facts.folder} refused: its weights do not fit the model the run's "
                            f"config builds ({str(err).splitlines()[-1].strip()}); the config or the checkpoint is "
                            "not the run's") from None
    with torch.no_grad():
        logits = model.masked_logits(**batch)
        out = model(**batch)
    loss = float(out.get("mlm_loss", out["loss"]))  # as the engine's evaluation reads it
    rows = ("doc-packed rows (positions restart per document, block-diagonal attention)" if "document_ids" in batch
            else "padded rows" if "attention_mask" in batch else "full rows")
    if "token_type_ids" in batch:
        rows += " of segment pairs"
    kernel = attention if attention == trained_with else f"{attention} (the run used {trained_with})"
    trained = "" if facts.precision == "fp32" else f", its {facts.precision} run's fp32 weights"
    return logits, loss, (f"training forward ({type(model).__name__} built from the run's config: MLM head at "
                          f"masked positions only), {rows}, {kernel}{trained}")


def user_rows(batch: dict[str, torch.Tensor], pad_id: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The batch as a user feeds it to the exported model (each document a row of its own, padded, positions left to
    transformers), and its labels laid out the same way."""
    labels = dense_labels(batch)
    if "document_ids" not in batch:
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
        return inputs, labels
    pieces = []
    for row, documents in enumerate(batch["document_ids"]):
        for document in documents.unique():
            if document >= 0:  # -1 is padding
                where = documents == document
                pieces.append((batch["input_ids"][row][where], labels[row][where]))
    longest = max(len(ids) for ids, _ in pieces)
    ids = torch.full((len(pieces), longest), pad_id, dtype=torch.long)
    user_labels = torch.full((len(pieces), longest), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(pieces), longest), dtype=torch.long)
    for i, (piece, label) in enumerate(pieces):
        ids[i, : len(piece)], user_labels[i, : len(piece)], mask[i, : len(piece)] = piece, label, 1
    return {"input_ids": ids, "attention_mask": mask}, user_labels


def exported_outputs(folder: Path, batch: dict[str, torch.Tensor], pad_id: int) -> tuple[torch.Tensor, float]:
    """The masked positions' logits, in the batch's order, and the MLM loss from the exported folder, loaded as a
    user loads it."""
    from transformers import AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # BERT's export loads without its next-sentence head: a report each time
    try:
        model = AutoModelForMaskedLM.from_pretrained(folder).eval()
    finally:
        hf_logging.set_verbosity(verbosity)
    inputs, labels = user_rows(batch, pad_id)
    with torch.no_grad():
        out = model(**inputs, labels=labels)
    return out.logits[labels != IGNORE_INDEX], float(out.loss)


def tokenizer_problem(fingerprint: str, facts: CheckpointFacts, what: str) -> str | None:
    """Why the tokenizer of `fingerprint` is not the one the run's shards were made with, or None."""
    from pipeline.data.shards.index import load_index

    folder = facts.phase.data.corpora()[0].path
    try:
        made_with = load_index(folder)["tokenizer"]
    except PipelineError as err:
        raise PipelineError(f"the export is checked on the run's validation shards, which cannot be read: {err}. "
                            "Restore the shard folder the run's config names") from None
    if fingerprint == made_with["fingerprint"]:
        return None
    return (f"{what} is not the tokenizer the run's shards {folder} were made with: its fingerprint is {fingerprint}, "
            f"the shards' {made_with['fingerprint']} ({made_with['name']}). A model is useless with another "
            "tokenizer's ids; restore the run's tokenizer/ folder (a copy of data.tokenizer)")


@dataclass(frozen=True)
class ExportCheck:
    """What the export's check found: the logits' agreement, both MLM losses, the tokenizer's fingerprint."""

    logits: Agreement
    reference_loss: float
    exported_loss: float
    tokenizer_fingerprint: str

    @property
    def loss_difference(self) -> float:
        difference = abs(self.reference_loss - self.exported_loss)
        return difference if math.isfinite(difference) else math.inf

    @property
    def loss_tolerance(self) -> float:
        """fp32's relative tolerance, of the reference loss's size (at least 1)."""
        return RELATIVE_TOLERANCE["fp32"] * max(1.0, abs(self.reference_loss) if math.isfinite(self.reference_loss)
                                                else 1.0)

    def refuse_unless_passed(self, what: str) -> None:
        """Stop with the figures when the logits or the loss differ beyond the tolerance."""
        refuse_unless_within(self.logits, what)
        if self.loss_difference > self.loss_tolerance:
            raise PipelineError(
                f"{what} refused: on the checked batch the MLM loss is {self.reference_loss:.6g} through the "
                f"training path ({self.logits.reference}) and {self.exported_loss:.6g} through the saved folder, "
                f"{self.loss_difference:.3g} apart, over the tolerance {self.loss_tolerance:.3g}. The labels or "
                "the masked positions do not reach the saved model as they reached the training one")

    def record(self) -> dict:
        return {**self.logits.record(), "mlm_loss": {
            "reference": self.reference_loss, "exported": self.exported_loss, "difference": self.loss_difference,
            "tolerance": self.loss_tolerance}, "tokenizer_fingerprint": self.tokenizer_fingerprint}


class ExportProof:
    """The proof an export of one checkpoint must pass: the run's tokenizer the shards' (refused before any weight is
    read), then, once the folder is written, the checked batch through both paths."""

    def __init__(self, facts: CheckpointFacts, tokenizer):
        from pipeline.data.tokenizer import describe_tokenizer

        self.facts, self.tokenizer, self.info = facts, tokenizer, describe_tokenizer(tokenizer)
        if problem := tokenizer_problem(self.info.fingerprint, facts,
                                        f"the run's tokenizer ({tokenizer.name_or_path})"):
            raise PipelineError(f"the export of {facts.folder} refused: {problem}")

    def check(self, folder: Path, state: dict[str, torch.Tensor], hf_config: dict) -> ExportCheck:
        """Both paths on the checkpoint's first validation batch, compared; refused beyond the tolerance (an exported
        tokenizer that is not the shards' first). `hf_config`: the exported model's (the shape of an init_from
        run's training model)."""
        from transformers import AutoTokenizer

        from pipeline.data.tokenizer import describe_tokenizer

        facts = self.facts
        exported_fingerprint = describe_tokenizer(AutoTokenizer.from_pretrained(folder)).fingerprint
        if problem := tokenizer_problem(exported_fingerprint, facts, f"the tokenizer saved in the export ({folder})"):
            raise PipelineError(f"the export of {facts.folder} refused: {problem}")
        batch = validation_batch(facts, self.tokenizer, self.info)
        reference, reference_loss, path = training_path(facts, hf_config, state, self.info, batch)
        exported, exported_loss = exported_outputs(folder, batch, self.tokenizer.pad_token_id)
        check = ExportCheck(compare_logits(reference, exported, "fp32", path), reference_loss, exported_loss,
                            exported_fingerprint)
        check.refuse_unless_passed(f"the export of {facts.folder}")
        return check


def training_model(model: ModelConfig, hf: dict, tokenizer: TokenizerInfo, seq_len: int, phase: Phase,
                   state: dict[str, torch.Tensor], attention: str, source: str | Path) -> torch.nn.Module:
    """The training class as the trainer built it, with `attention`, holding `state`, in fp32 and eval mode: from the
    model section (positions for `seq_len`, `phase`'s RoPE bases), or for a `model.init_from` run from the shape
    its record keeps (`hf`: the folder's, which may be a hub name)."""
    import dataclasses

    from pipeline.models.architectures.hf_model import (
        SPARSE_CLASSES,
        build_model,
        load_trained_weights,
        use_rope_thetas,
    )

    if model.init_from:
        cls = SPARSE_CLASSES[model.architecture]
        built = cls(cls.config_class.from_dict({**hf, "attn_implementation": attention}))
        if model.architecture == "bert":  # a training switch the record's config does not hold: the run's
            built.next_sentence_loss = model.next_sentence_loss
    else:
        built = build_model(dataclasses.replace(model, attn_implementation=attention), tokenizer, seq_len)
        use_rope_thetas(built, phase.global_rope_theta, phase.local_rope_theta, lambda _: None)
    return load_trained_weights(built, state, source).float().eval()
