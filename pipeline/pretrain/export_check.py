"""The export's proof: one validation batch through the training-time model and through the exported folder.

The training path is what the run optimised: the training class's `masked_logits` (the MLM head at the batch's
masked slots, the real ones kept), on the batch as `MaskedBatches` made it (doc-packed rows with positions
restarting per document and attention kept inside each; padded rows with their mask; BERT's segment pairs), in
the run's precision. The exported path is what a user gets: `AutoModelForMaskedLM.from_pretrained(folder)` in
fp32, fed each document as a row of its own, padded, with the positions transformers computes itself. The logits
of the masked positions are compared (`pipeline/common/output_agreement.py`).

The check runs on the CPU. A run that trained with FlashAttention-2 or FlexAttention is replayed with SDPA
and the same document mask (the kernels compute the same attention); the record names the kernel used.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipeline.common.errors import PipelineError
from pipeline.common.output_agreement import DTYPES, Agreement, compare_logits
from pipeline.pretrain.checkpoint_facts import CheckpointFacts
from pipeline.pretrain.masked_slots import dense_labels
from pipeline.pretrain.masking import EVAL_STREAM, IGNORE_INDEX

CHECK_ROWS = 8
"""Validation sequences in the checked batch (the first ones, as the run's evaluation takes them)."""

CPU_ATTENTION = ("sdpa", "eager")
"""Attention kernels the check replays as the run used them; others are replayed with SDPA."""


class _FirstRows:
    """The first `rows` sequences of a shard folder's validation split, as `MaskedBatches` reads a cache."""

    def __init__(self, folder: str, rows: int):
        from pipeline.data.shard_reader import ShardedDataset

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


def validation_batch(facts: CheckpointFacts, tokenizer) -> dict[str, torch.Tensor]:
    """The first validation micro batch of the phase that trained the checkpoint's last step (of a mix, its first
    corpus's), masked as the run's evaluation masks it."""
    from pipeline.data.tokenizer import describe_tokenizer
    from pipeline.pretrain.batches import MaskedBatches, MicroBatchKey
    from pipeline.pretrain.masking import build_masker
    from pipeline.pretrain.model import first_position_id
    from pipeline.pretrain.phases import resolve_phases

    c = facts.config
    phases = resolve_phases(c)
    phase = next((p for p in phases if p.start < facts.step <= p.end), phases[-1])  # past the end: an anneal
    rows = _FirstRows(phase.data.corpora()[0].path, CHECK_ROWS)
    info = describe_tokenizer(tokenizer)
    masker = build_masker(c.masking, tokenizer, info.vocab_size, info.mask_id, c.train.seed, evaluation=True)
    batches = MaskedBatches(rows, masker, with_segments=facts.architecture == "bert",
                            position_offset=first_position_id(facts.architecture, info.pad_id))
    return batches[MicroBatchKey(0, np.arange(len(rows)), EVAL_STREAM)]


def training_path_logits(facts: CheckpointFacts, hf_config: dict, state: dict[str, torch.Tensor],
                         batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, str]:
    """The masked positions' logits from the training class (built from `hf_config`, the trained model's
    transformers config) on the run's path; and that path in words."""
    from pipeline.pretrain.model import SPARSE_CLASSES, load_trained_weights

    cls = SPARSE_CLASSES[facts.architecture]
    trained_with = facts.config.model.attn_implementation
    attention = trained_with if trained_with in CPU_ATTENTION else "sdpa"
    config = cls.config_class.from_dict({**hf_config, "attn_implementation": attention})
    model = load_trained_weights(cls(config), state, facts.folder)
    model.to(DTYPES[facts.precision]).eval()
    with torch.no_grad():
        logits = model.masked_logits(**batch)
    rows = ("doc-packed rows (positions restart per document, block-diagonal attention)" if "document_ids" in batch
            else "padded rows" if "attention_mask" in batch else "full rows")
    if "token_type_ids" in batch:
        rows += " of segment pairs"
    kernel = attention if attention == trained_with else f"{attention} (the run used {trained_with})"
    return logits, f"training forward ({cls.__name__}: MLM head at masked positions only), {rows}, {kernel}"


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


def exported_logits(folder: Path, batch: dict[str, torch.Tensor], pad_id: int) -> torch.Tensor:
    """The masked positions' logits from the exported folder, loaded as a user loads it, in the batch's order."""
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
        logits = model(**inputs).logits
    return logits[labels != IGNORE_INDEX]


def check_export(facts: CheckpointFacts, hf_config: dict, state: dict[str, torch.Tensor], folder: Path,
                 tokenizer) -> Agreement:
    """Both paths on the checkpoint's first validation batch, compared."""
    batch = validation_batch(facts, tokenizer)
    reference, path = training_path_logits(facts, hf_config, state, batch)
    exported = exported_logits(folder, batch, tokenizer.pad_token_id)
    return compare_logits(reference, exported, facts.precision, path)
