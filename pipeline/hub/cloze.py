"""Cloze: does a masked-LM fill blanks in held-out text? Top-1 accuracy at masked positions, and examples.

    enc = Encoder.from_pretrained("runs/default/pretrain/export")
    texts = validation_texts("runs/default/shards", enc.tokenizer)
    cloze_accuracy(enc, texts)              # 0.31: share of masked tokens whose top-1 guess is the token
    fill_mask_examples(enc, texts, count=3)  # three held-out lines, one word masked, the top-3 fillings

The validation loss says how well the model predicts on average; a model on the unigram plateau
(pretraining's `report/plateau.py`) guesses " the" or "." everywhere and gets only the share of those
tokens right. The cloze accuracy says how often its first guess is the word, through the hub
interface a user calls, on text the model never trained on.

Masking: `mask_rate` of each text's ordinary (non-special) tokens, at least one, chosen by a
seeded generator per text (the same positions every call), are all replaced by `<mask>` in one
forward pass, as in pretraining; every chosen position is scored. So a text of 100 tokens at 0.15
costs one forward for its 15 blanks. All blanks are `<mask>` (no 10% kept / 10% random): the
score measures the use of context alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.common.errors import PipelineError
from pipeline.hub.encoder import MASK


@dataclass(frozen=True)
class ClozeScore:
    correct: int
    masked: int
    texts: int
    constant_correct: int = 0
    """Hits of the best constant guess (the blanks' most frequent token): what the plateau gets right."""

    @property
    def accuracy(self) -> float:
        return self.correct / self.masked if self.masked else float("nan")

    @property
    def constant_accuracy(self) -> float:
        """The accuracy of always guessing the most frequent blanked token: the plateau's cloze accuracy."""
        return self.constant_correct / self.masked if self.masked else float("nan")


def masked_positions(ids: list[int], special: set[int], mask_rate: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted positions to blank in one tokenized text: `mask_rate` of its ordinary tokens, at least one."""
    ordinary = np.array([i for i, t in enumerate(ids) if t not in special], dtype=np.int64)
    if len(ordinary) == 0:
        return ordinary
    count = max(1, int(round(mask_rate * len(ordinary))))
    return np.sort(rng.choice(ordinary, size=min(count, len(ordinary)), replace=False))


@torch.no_grad()
def cloze_score(encoder, texts: Iterable[str], mask_rate: float = 0.15, seed: int = 0, max_texts: int | None = 256,
                batch_size: int = 16) -> ClozeScore:
    """Top-1 fill-mask hits over the first `max_texts` texts (all when None); see the module docstring."""
    if not 0 < mask_rate <= 1:
        raise ValueError(f"mask_rate must be in (0, 1], got {mask_rate}")
    if encoder.lm_head is None:  # before tokenizing anything: the same message fill_mask gives
        raise PipelineError(f"cloze needs a masked-LM head, and this model has none: {encoder.no_lm_head_reason}")
    tokenizer = encoder.tokenizer
    special = set(tokenizer.all_special_ids)
    mask_id = tokenizer.mask_token_id
    rows: list[tuple[list[int], np.ndarray]] = []
    for index, text in enumerate(texts):
        if max_texts is not None and index >= max_texts:
            break
        ids = tokenizer(text, truncation=True, max_length=encoder.max_positions)["input_ids"]
        # One generator per text, keyed by (seed, index): a text's blanks do not depend on the texts before it.
        positions = masked_positions(ids, special, mask_rate, np.random.default_rng([seed, index]))
        if len(positions):
            rows.append((ids, positions))
    correct = masked = 0
    targets: list[int] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start: start + batch_size]
        inputs = []
        for ids, positions in chunk:
            blanked = torch.tensor(ids, dtype=torch.long)
            blanked[torch.from_numpy(positions)] = mask_id
            inputs.append(blanked)
        features = encoder.extract_features(encoder.pad(inputs))
        for row, (ids, positions) in enumerate(chunk):
            where = torch.from_numpy(positions)
            guesses = encoder.lm_head(features[row, where]).argmax(dim=-1).cpu()
            answers = torch.tensor(ids)[where]
            correct += int((guesses == answers).sum())
            masked += len(positions)
            targets += answers.tolist()
    constant = int(np.bincount(targets).max()) if targets else 0
    return ClozeScore(correct, masked, len(rows), constant)


def cloze_accuracy(encoder, texts: Iterable[str], mask_rate: float = 0.15, seed: int = 0,
                   max_texts: int | None = 256) -> float:
    """Share of masked tokens of held-out `texts` whose top-1 fill-mask guess is the token (see `cloze_score`)."""
    return cloze_score(encoder, texts, mask_rate, seed, max_texts).accuracy


def validation_texts(shards: str | Path, tokenizer, min_chars: int = 40, limit: int | None = None) -> list[str]:
    """The documents (or pieces of them) of a shard folder's validation split, decoded, in order; the first
    `limit` of them (None: all).

    Each sequence is cut at its special tokens (`<s>`, `</s>`, padding), so packed rows give one
    text per document piece; pieces shorter than `min_chars` are left out.
    """
    from pipeline.data.shards.reader import ShardedDataset

    data = ShardedDataset(shards, "val", cache_shards=1)
    special = np.array(sorted(set(tokenizer.all_special_ids)))
    texts = []
    for i in range(len(data)):
        ids = np.asarray(data[i]["input_ids"], dtype=np.int64)
        cuts = np.flatnonzero(np.isin(ids, special))
        for piece in np.split(ids, cuts):
            piece = piece[~np.isin(piece, special)]
            text = tokenizer.decode(piece.tolist(), clean_up_tokenization_spaces=False).strip() if len(piece) else ""
            if len(text) >= min_chars:
                texts.append(text)
            if len(texts) == limit:
                return texts
    return texts


@dataclass(frozen=True)
class FillMaskExample:
    masked_text: str
    answer: str
    top: list[tuple[str, float]]
    """The top fillings as (token, probability), best first."""


def fill_mask_examples(encoder, texts: Iterable[str], count: int = 3, topk: int = 3, seed: int = 0,
                       min_words: int = 6, max_words: int = 24) -> list[FillMaskExample]:
    """`count` held-out lines with one word blanked, and the model's `topk` fillings (`Encoder.fill_mask`).

    Lines of `min_words` to `max_words` words are taken in a seeded order, and in each a word of
    three or more letters that is one token (so one `<mask>` can be right) is blanked; which word
    is chosen by the seed, not by how well the model does on it.
    """
    tokenizer = encoder.tokenizer
    lines = [line.strip() for text in texts for line in text.split("\n")]
    lines = [line for line in lines if min_words <= len(line.split()) <= max_words]
    rng = np.random.default_rng(seed)
    examples = []
    for index in rng.permutation(len(lines)):
        line = lines[index]
        ids = tokenizer(line, add_special_tokens=False)["input_ids"]
        pieces = [tokenizer.decode([t], clean_up_tokenization_spaces=False) for t in ids]
        # One-token words: a piece of letters with a leading space whose next piece starts a new word or is punctuation.
        candidates = [i for i, piece in enumerate(pieces) if i > 0 and piece.startswith(" ")
                      and piece[1:].isalpha() and len(piece) > 3
                      and (i + 1 == len(pieces) or not pieces[i + 1][:1].isalnum())]
        if not candidates:
            continue
        i = int(candidates[rng.integers(len(candidates))])
        masked = "".join(pieces[:i]) + f" {MASK}" + "".join(pieces[i + 1:])
        filled = encoder.fill_mask(masked, topk=topk)
        examples.append(FillMaskExample(masked, pieces[i], [(token, prob) for _, prob, token in filled]))
        if len(examples) == count:
            break
    return examples
