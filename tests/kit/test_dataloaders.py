"""The Kit's loaders: hashed dynamic masks (15%, new each epoch, same on a rerun), static masks, classification."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.common.errors import PipelineError
from pipeline.kit import create_classification_dataloader, create_mlm_dataloader
from pipeline.pretrain.plan.masking import IGNORE_INDEX


@pytest.fixture(scope="module")
def tokenizer(bpe_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bpe_tokenizer_dir)


def epoch_batches(loader) -> list[dict[str, torch.Tensor]]:
    return list(loader)


def masked_fraction(batches, special_ids) -> float:
    chosen = maskable = 0
    for batch in batches:
        labels = batch["labels"]
        originals = torch.where(labels != IGNORE_INDEX, labels, batch["input_ids"])
        ordinary = ~torch.isin(originals, torch.tensor(special_ids))
        chosen += int((labels != IGNORE_INDEX).sum())
        maskable += int(ordinary.sum())
    return chosen / maskable


def test_mlm_loader_masks_15_percent_new_each_epoch_and_the_same_on_a_rerun(documents, tokenizer):
    loader = create_mlm_dataloader(documents, tokenizer, batch_size=16, max_length=64, seed=7)
    first, second = epoch_batches(loader), epoch_batches(loader)
    assert all(b["input_ids"].shape[1] == 64 for b in first)
    fraction = masked_fraction(first, tokenizer.all_special_ids)
    assert abs(fraction - 0.15) < 0.01, fraction
    assert sum(int(b["labels"].ne(IGNORE_INDEX).sum()) for b in first) > 2000  # enough tokens for ±1 point
    # Epoch 2 masks other positions; a rerun with the same seed masks the same ones.
    assert not all(torch.equal(a["labels"], b["labels"]) for a, b in zip(first, second, strict=True))
    rerun = create_mlm_dataloader(documents, tokenizer, batch_size=16, max_length=64, seed=7)
    for a, b in zip(first, epoch_batches(rerun), strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    other_seed = epoch_batches(create_mlm_dataloader(documents, tokenizer, batch_size=16, max_length=64, seed=8))
    assert not torch.equal(first[0]["labels"], other_seed[0]["labels"])


def test_a_sequence_keeps_its_mask_under_static_masking(documents, tokenizer):
    loader = create_mlm_dataloader(documents, tokenizer, batch_size=8, max_length=64, static_masking=True,
                                   shuffle=False)
    first, second = epoch_batches(loader), epoch_batches(loader)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a["labels"], b["labels"])


def test_padded_rows_mask_no_padding_and_read_files(documents, tokenizer, tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\n\n".join(documents[:50]))
    loader = create_mlm_dataloader(path, tokenizer, batch_size=10, max_length=32, pack=False, shuffle=False)
    batches = epoch_batches(loader)
    assert len(loader.dataset) == 50
    for batch in batches:
        pad = batch["attention_mask"] == 0
        assert (batch["labels"][pad] == IGNORE_INDEX).all() and batch["input_ids"].shape[1] <= 32
    with pytest.raises(PipelineError, match="no such file"):
        create_mlm_dataloader(tmp_path / "missing.txt", tokenizer, 4)
    with pytest.raises(PipelineError, match="fewer than one packed row"):
        create_mlm_dataloader(["a b"], tokenizer, 4, max_length=64)


def test_classification_loader_takes_pairs_and_label_names(wordpiece_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(wordpiece_tokenizer_dir)
    pairs = [("the river", "a model"), ("seven orange tensors", "the mask")]
    loader = create_classification_dataloader(pairs, ["yes", "no"], tok, batch_size=2)
    (batch,) = list(loader)
    expected = tok(*zip(*pairs, strict=True), padding=True, return_tensors="pt")
    assert torch.equal(batch["input_ids"], expected["input_ids"])
    assert torch.equal(batch["token_type_ids"], expected["token_type_ids"])
    assert loader.label_names == ("no", "yes") and batch["labels"].tolist() == [1, 0]
    with pytest.raises(PipelineError, match="not in label_names"):
        create_classification_dataloader(pairs, ["yes", "maybe"], tok, 2, label_names=["no", "yes"])
    assert np.array_equal(next(iter(create_classification_dataloader(["a", "b"], [0, 1], tok, 2)))["labels"], [0, 1])
