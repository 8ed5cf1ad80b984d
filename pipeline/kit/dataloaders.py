"""DataLoaders from a list of texts (or a file): masked-LM batches with the pipeline's masker, and classification.

The MLM loader packs texts into full sequences with the shard stage's `FullPacker` (or pads one
text per row) and masks each batch with the pretraining `Masker`: a token's mask is a hash of
(seed, epoch, sequence index, position), so every pass over the loader is a new epoch with new
masks, a rerun with the same seed gives the same masks, and `static_masking` keeps one mask per
sequence for good. The classification loader reuses fine-tuning's tokenization and HF's padding collator.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from pipeline.common.errors import PipelineError
from pipeline.pretrain.config import MaskingConfig
from pipeline.pretrain.plan.masking import Masker


def read_texts(texts: Sequence[str] | str | os.PathLike) -> list[str]:
    """A list of strings as given, or the documents of a .txt (blank-line separated) / .jsonl / .zst / .parquet file."""
    if isinstance(texts, (str, os.PathLike)):
        from pipeline.data.corpus import CorpusOptions, check_sources, iter_texts, resolve_inputs

        if not Path(texts).exists():
            raise PipelineError(f"texts {texts}: no such file (pass a list of strings, or a text/jsonl file)")
        sources = resolve_inputs([str(texts)])
        options = CorpusOptions()
        check_sources(sources, options)
        return list(iter_texts(sources, options))
    texts = list(texts)
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise PipelineError(f"texts[{bad}]: expected a string, got {type(texts[bad]).__name__}")
    if not texts:
        raise PipelineError("texts: the list is empty")
    return texts


def _tokenizer(tokenizer):
    from pipeline.data.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer


class EpochBatches(torch.utils.data.Sampler):
    """Batches of (epoch, index) pairs; every iteration is the next epoch, shuffled by (seed, epoch)."""

    def __init__(self, size: int, batch_size: int, shuffle: bool, seed: int, drop_last: bool = False):
        self.size, self.batch_size, self.shuffle, self.seed, self.drop_last = size, batch_size, shuffle, seed, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Serve epoch `epoch` next (as `DistributedSampler.set_epoch` does)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size // self.batch_size if self.drop_last else -(-self.size // self.batch_size)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch = self.epoch
        self.epoch += 1
        order = (np.random.default_rng([self.seed, epoch]).permutation(self.size) if self.shuffle
                 else np.arange(self.size))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            if len(chunk) == self.batch_size or not self.drop_last:
                yield [(epoch, int(i)) for i in chunk]


class MaskedSequences(torch.utils.data.Dataset):
    """Token rows; item `(epoch, index)` → (epoch, index, ids) so the collator can mask by epoch."""

    def __init__(self, rows: list[np.ndarray]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: tuple[int, int]) -> tuple[int, int, np.ndarray]:
        epoch, index = item
        return epoch, index, self.rows[index]


class MaskingCollator:
    """Pad rows to the longest, then corrupt them with the pipeline's hashed `Masker`."""

    def __init__(self, masker: Masker, pad_id: int):
        self.masker, self.pad_id = masker, pad_id

    def __call__(self, items: list[tuple[int, int, np.ndarray]]) -> dict[str, torch.Tensor]:
        epoch = items[0][0]
        width = max(len(row) for _, _, row in items)
        ids = np.full((len(items), width), self.pad_id, dtype=np.int64)
        for r, (_, _, row) in enumerate(items):
            ids[r, :len(row)] = row
        corrupted, labels = self.masker(ids, epoch, np.array([i for _, i, _ in items]))
        return {"input_ids": torch.from_numpy(corrupted), "attention_mask": torch.from_numpy((ids != self.pad_id)
                                                                                             .astype(np.int64)),
                "labels": torch.from_numpy(labels)}


def create_mlm_dataloader(texts: Sequence[str] | str | os.PathLike, tokenizer, batch_size: int,
                          mask_probability: float = 0.15, *, max_length: int = 128, pack: bool = True,
                          static_masking: bool = False, seed: int = 0, shuffle: bool = True, drop_last: bool = False,
                          mask_token_fraction: float = 0.8, random_token_fraction: float = 0.1,
                          num_workers: int = 0) -> torch.utils.data.DataLoader:
    """Masked-LM batches (`input_ids`, `attention_mask`, `labels`) for HF `*ForMaskedLM` models.

    `pack`: join texts into full `max_length` rows (RoBERTa's FULL-SENTENCES; the last partial row
    is dropped); otherwise one text per row, truncated to `max_length` and padded per batch.
    Each pass over the loader is a new epoch (`loader.batch_sampler.set_epoch(n)` picks one).
    """
    from pipeline.data.packers import FullPacker

    tok = _tokenizer(tokenizer)
    if not 0 < mask_probability < 1:
        raise PipelineError(f"mask_probability must be between 0 and 1, got {mask_probability}")
    if batch_size < 1 or max_length < 8:
        raise PipelineError(f"batch_size must be ≥ 1 and max_length ≥ 8, got {batch_size} and {max_length}")
    texts = read_texts(texts)
    cls_id = tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id
    sep_id = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
    if tok.mask_token_id is None or tok.pad_token_id is None or cls_id is None or sep_id is None:
        raise PipelineError("the tokenizer lacks a mask, pad, cls/bos or sep/eos token, which masked-LM batches need")
    pieces = tok(texts, add_special_tokens=False)["input_ids"]
    if pack:
        packer = FullPacker(max_length, cls_id, sep_id, tok.pad_token_id, np.int64)
        lengths = np.array([len(p) for p in pieces])
        flat = np.fromiter((t for p in pieces for t in p), dtype=np.int64, count=int(lengths.sum()))
        rows = list(packer.add(flat, lengths)["input_ids"])
        if not rows:
            raise PipelineError(f"the texts hold {int(lengths.sum())} tokens, fewer than one packed row of "
                                f"{max_length}; pass more text, a smaller max_length, or pack=False")
    else:
        rows = [np.array([cls_id, *p[:max_length - 2], sep_id], dtype=np.int64) for p in pieces]
    masking = MaskingConfig(mode="static" if static_masking else "dynamic", probability=mask_probability,
                            mask_token_fraction=mask_token_fraction, random_token_fraction=random_token_fraction)
    return torch.utils.data.DataLoader(
        MaskedSequences(rows), batch_sampler=EpochBatches(len(rows), batch_size, shuffle, seed, drop_last),
        collate_fn=MaskingCollator(Masker(len(tok), tok.mask_token_id, tok.all_special_ids, seed, masking=masking),
                                   tok.pad_token_id), num_workers=num_workers)


def create_classification_dataloader(texts: Sequence[str] | Sequence[tuple[str, str]], labels: Sequence,
                                     tokenizer, batch_size: int, *, max_length: int = 128, shuffle: bool = False,
                                     seed: int = 0, label_names: Sequence[str] | None = None,
                                     regression: bool = False, num_workers: int = 0) -> torch.utils.data.DataLoader:
    """Padded batches (`input_ids`, `attention_mask`, [`token_type_ids`], `labels`) of single texts or pairs.

    Labels are class ids, or names (mapped through `label_names`, else their sorted set); the
    names in use are `loader.label_names`.
    """
    from transformers import DataCollatorWithPadding

    from pipeline.data.tasks.splits import Split
    from pipeline.finetune.families.sequence.family import EncodedSplit

    tok = _tokenizer(tokenizer)
    texts = [(t,) if isinstance(t, str) else tuple(t) for t in texts]
    if len(texts) != len(labels):
        raise PipelineError(f"{len(texts)} texts but {len(labels)} labels")
    if not texts or {len(t) for t in texts} not in ({1}, {2}):
        raise PipelineError("texts: expected a non-empty list of strings, or of (text, text) pairs, not a mix")
    ids, names = _label_ids(list(labels), label_names, regression)
    loader = torch.utils.data.DataLoader(
        EncodedSplit(Split("texts", texts, ids, [str(i) for i in range(len(texts))]), tok, max_length, regression),
        batch_size=batch_size, shuffle=shuffle, collate_fn=DataCollatorWithPadding(tok), num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed))
    loader.label_names = names
    return loader


def _label_ids(labels: list, label_names: Sequence[str] | None, regression: bool) -> tuple[list, tuple | None]:
    if regression:
        return [float(v) for v in labels], None
    if all(isinstance(v, (int, np.integer)) for v in labels):
        n = max(labels) + 1
        return [int(v) for v in labels], tuple(label_names) if label_names else tuple(str(i) for i in range(n))
    names = tuple(label_names) if label_names else tuple(sorted({str(v) for v in labels}))
    index = {name: i for i, name in enumerate(names)}
    unknown = sorted({str(v) for v in labels} - index.keys())
    if unknown:
        raise PipelineError(f"labels {unknown[:5]} are not in label_names {list(names)}")
    return [index[str(v)] for v in labels], names
