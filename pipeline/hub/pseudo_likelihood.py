"""Pseudo-log-likelihood (PLL) of sentences under a masked-LM (Salazar et al. 2020, "Masked Language Model Scoring").

    enc = Encoder.from_pretrained("runs/default/pretrain/export")
    enc.score(["The cat is here.", "The cat are here."])   # two log-likelihoods: higher is more likely

A sentence's PLL is the sum, over its tokens, of log P(token | every other token), each token
masked in turn: a sentence of n ordinary tokens costs n masked copies. Special tokens (`<s>`,
`</s>`, `[CLS]`, `[SEP]`, and also `[UNK]`, which is special in the tokenizer) are in every copy
but never masked nor scored, so two sentences are compared on their own words only.

Speed: the masked copies of several sentences go through the model together, in batches bounded
by `batch_tokens` (rows × padded length) so memory stays bounded; sentences are sorted by length
first (length bucketing) so a batch carries little padding; the MLM head runs at the one masked
position of each row only (its vocabulary projection is as costly as a layer of a small model),
and all of it runs under `torch.inference_mode`.

Precision: fp32 by default (equal to the one-mask-at-a-time definition). `precision="bf16"` runs
the forwards under bf16 autocast, the log-softmax still in fp32: 2 to 4.5 times the pairs per
second on a CPU with native bf16 (`avx512_bf16`, `amx_bf16`), the PLL of a 20-token sentence
within 0.02 nats of fp32's (both measured on the main job's shape, random weights; see
docs/benchmarks.md); never chosen here silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Literal

import torch

from pipeline.common.errors import PipelineError

DEFAULT_BATCH_TOKENS = 2048
"""Rows × padded length of one forward; on 1 CPU thread 1k to 4k scored the same and 8k was 5–15% slower."""
Precision = Literal["fp32", "bf16"]


def scored_positions(ids: Sequence[int], special_ids: set[int]) -> list[int]:
    """Positions of `ids` that are masked and scored: every token that is not special."""
    return [i for i, t in enumerate(ids) if t not in special_ids]


def check_can_score(encoder) -> None:
    """A `PipelineError` naming the model when it has no trained MLM head (headless encoder, fine-tuned classifier)."""
    if encoder.lm_head is None:
        name = encoder.source.path if getattr(encoder, "source", None) is not None else "this model"
        raise PipelineError(f"model {name}: pseudo-log-likelihood scoring needs a masked-LM head, and it has none: "
                            f"{encoder.no_lm_head_reason}")


def pseudo_log_likelihoods(encoder, sentences: Sequence[str], batch_tokens: int = DEFAULT_BATCH_TOKENS,
                           precision: Precision = "fp32") -> list[float]:
    """The PLL (natural log) of each sentence, in order; see the module docstring. 0.0 for a sentence with no tokens."""
    check_can_score(encoder)
    if precision not in ("fp32", "bf16"):
        raise PipelineError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
    if batch_tokens < 1:
        raise PipelineError(f"batch_tokens must be at least 1, got {batch_tokens}")
    if not sentences:
        return []
    tokenizer = encoder.tokenizer
    encoded = tokenizer(list(sentences))["input_ids"]
    for index, ids in enumerate(encoded):
        if len(ids) > encoder.max_positions:
            # Truncating would score a different sentence; say so rather than return a wrong number.
            raise PipelineError(f"sentence {index} is {len(ids)} tokens, more than the model's {encoder.max_positions} "
                                f"positions: {sentences[index][:80]!r}")
    special = set(tokenizer.all_special_ids)
    mask_id = tokenizer.mask_token_id
    device = encoder.device
    totals = torch.zeros(len(encoded), dtype=torch.float64)
    # Longest first: each batch is padded to its first sentence's length, and memory peaks on the first batch.
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    pending: list[tuple[int, list[int], list[int]]] = []  # (sentence, ids, positions still to put in a batch)
    rows = 0
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
    with torch.inference_mode(), autocast:
        for index in order:
            positions = scored_positions(encoded[index], special)
            while positions:
                width = len(pending[0][1]) if pending else len(encoded[index])
                room = max(1, batch_tokens // width) - rows
                if room <= 0:
                    _score_batch(encoder, pending, width, mask_id, totals, device)
                    pending, rows = [], 0
                    continue
                take, positions = positions[:room], positions[room:]
                pending.append((index, encoded[index], take))
                rows += len(take)
        if pending:
            _score_batch(encoder, pending, len(pending[0][1]), mask_id, totals, device)
    return totals.tolist()


def _score_batch(encoder, pending: list[tuple[int, list[int], list[int]]], width: int, mask_id: int,
                 totals: torch.Tensor, device: torch.device) -> None:
    """One forward over the masked copies in `pending`; each row's log-prob of its true token added to its total."""
    count = sum(len(p) for _, _, p in pending)
    tokens = torch.full((count, width), encoder.pad_id, dtype=torch.long)
    sentence = torch.empty(count, dtype=torch.long)
    where = torch.empty(count, dtype=torch.long)
    row = 0
    for index, ids, positions in pending:
        n = len(positions)
        tokens[row:row + n, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        sentence[row:row + n] = index
        where[row:row + n] = torch.tensor(positions, dtype=torch.long)
        row += n
    rows = torch.arange(count)
    targets = tokens[rows, where].clone()
    tokens[rows, where] = mask_id
    features = encoder.extract_features(tokens.to(device))
    logits = encoder.lm_head(features[rows.to(device), where.to(device)]).float()
    scores = logits.log_softmax(dim=-1).gather(1, targets.to(device)[:, None])[:, 0]
    totals.index_add_(0, sentence, scores.cpu().double())
