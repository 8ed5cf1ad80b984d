"""The span-contrastive term: spans drawn on the host per sequence key, inside their documents, in static shapes;
pooled and scored on the device as plain indexing and the InfoNCE formula say; off, nothing changes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from pipeline.common.config.tree import build_config
from pipeline.data.tokenizer import TokenizerInfo
from pipeline.models.architectures.config import ModelConfig
from pipeline.models.architectures.hf_model import build_model
from pipeline.models.architectures.packed_attention import document_layout
from pipeline.models.architectures.span_contrast import SpanContrast
from pipeline.pretrain.batches.masked_slots import masked_slots
from pipeline.pretrain.batches.span_sampler import OUTSIDE, SpanSampler, row_documents
from pipeline.pretrain.config import ContrastiveConfig, PretrainConfig
from pipeline.pretrain.plan.masking import IGNORE_INDEX, Masker

CONFIG = ContrastiveConfig(weight=1.0, min_tokens=4, max_tokens=12, min_document_tokens=10)
SEQ_LEN = 64


def packed_documents(lengths_per_row: list[list[int]]) -> np.ndarray:
    """Per-token document ids of doc-packed rows holding documents of these lengths, padded to SEQ_LEN."""
    starts = np.full((len(lengths_per_row), 8), -1)
    for row, lengths in enumerate(lengths_per_row):
        starts[row, : len(lengths)] = np.cumsum([0, *lengths[:-1]])
    lengths = np.array([sum(row) for row in lengths_per_row])
    return document_layout(starts, lengths, SEQ_LEN, 0)[0]


def keys(indices, epoch=0) -> np.ndarray:
    return Masker(100, 4, (0, 1, 2), seed=0).keys(epoch, np.asarray(indices))


def spans_of(span_ids: np.ndarray, view: int) -> dict[int, tuple[int, np.ndarray]]:
    """Slot → (row, its positions) in one view."""
    rows, positions = np.nonzero(span_ids[view] != OUTSIDE)
    found = {}
    for slot in np.unique(span_ids[view][rows, positions]):
        here = span_ids[view][rows, positions] == slot
        assert len(set(rows[here])) == 1, "a span lies in one row"
        found[int(slot)] = (int(rows[here][0]), positions[here])
    return found


def test_spans_are_a_pure_function_of_the_sequences_keys():
    documents = packed_documents([[30, 20, 14], [64], [40, 9]])
    sampler = SpanSampler(CONFIG)
    first = sampler(keys([7, 8, 9]), documents)
    assert np.array_equal(first, sampler(keys([7, 8, 9]), documents))
    assert not np.array_equal(first, sampler(keys([7, 8, 9], epoch=1), documents))
    assert not np.array_equal(first, sampler(keys([1, 2, 3]), documents))


def test_each_document_slot_holds_two_contiguous_spans_of_one_document_within_the_bounds():
    documents = packed_documents([[30, 20, 14], [64], [40, 9], [5, 5]])
    span_ids = SpanSampler(CONFIG)(keys([0, 1, 2, 3]), documents)
    views = spans_of(span_ids, 0), spans_of(span_ids, 1)
    assert views[0].keys() == views[1].keys()
    for slot in views[0]:
        homes = set()
        for view in views:
            row, positions = view[slot]
            assert np.array_equal(positions, np.arange(positions[0], positions[-1] + 1)), "contiguous"
            (document,) = set(documents[row, positions])
            length = int((documents[row] == document).sum())
            assert max(4, math.ceil(0.1 * length)) <= len(positions) <= min(12, length // 2)
            homes.add((row, document))
        assert len(homes) == 1, "both views of a slot come from one document"


def test_the_shape_is_fixed_and_documents_too_short_for_two_spans_hold_none():
    sampler = SpanSampler(CONFIG)
    # Documents of 9 tokens and fewer are below min_document_tokens 10; at 10, a span of 4 … 5 tokens fits.
    short = sampler(keys([0, 1]), packed_documents([[9, 9, 9], [5]]))
    assert short.shape == (2, 2, SEQ_LEN) and (short == OUTSIDE).all()
    fits = sampler(keys([0, 1]), packed_documents([[9, 10], [5]]))
    assert fits.shape == (2, 2, SEQ_LEN) and set(np.unique(fits)) == {OUTSIDE, 0}
    assert (packed_documents([[9, 10], [5]])[0][fits[0, 0] == 0] == 1).all()


def test_more_documents_than_slots_fill_every_slot_with_distinct_documents():
    documents = packed_documents([[16, 16, 16, 16], [16, 16, 16, 16]])
    for per_row in (1, 3):
        config = ContrastiveConfig(weight=1.0, min_tokens=4, max_tokens=8, documents_per_row=per_row)
        span_ids = SpanSampler(config)(keys([4, 5]), documents)
        view = spans_of(span_ids, 0)
        assert sorted(view) == list(range(2 * per_row))
        assert len({(row, documents[row, positions[0]]) for row, positions in view.values()}) == 2 * per_row


def test_full_and_doc_rows_are_one_document_each_up_to_their_length():
    assert (row_documents(2, 8) == 0).all()
    lengths = np.array([20, 64])
    documents = row_documents(2, SEQ_LEN, lengths)
    assert (documents[0, :20] == 0).all() and (documents[0, 20:] == -1).all() and (documents[1] == 0).all()
    span_ids = SpanSampler(CONFIG)(keys([0, 1]), documents)
    assert (span_ids[:, 0, 20:] == OUTSIDE).all() and sorted(spans_of(span_ids, 1)) == [0, 1]


def test_pooled_spans_are_the_mean_of_their_tokens_hidden_states():
    torch.manual_seed(0)
    hidden = torch.randn(3, SEQ_LEN, 8)
    span_ids = SpanSampler(CONFIG)(keys([0, 1, 2]), packed_documents([[30, 20, 14], [64], [40, 9]]))
    means, counts = SpanContrast(1.0, 0.05).pool(hidden, torch.from_numpy(span_ids))
    assert means.shape == (2, 3, 8)
    for view in range(2):
        for slot, (row, positions) in spans_of(span_ids, view).items():
            torch.testing.assert_close(means[view, slot], hidden[row, positions].mean(0))
            assert counts[view, slot] == len(positions)


def test_the_loss_is_the_symmetric_infonce_of_a_hand_made_case_and_empty_slots_are_no_negatives():
    """Two documents whose spans have unit hidden states: a₀ = b₀ = e₀, a₁ = e₁, b₁ = (e₀ + e₁)/√2."""
    hidden = torch.zeros(3, 4, 2)
    hidden[0, 0] = hidden[0, 1] = torch.tensor([1.0, 0.0])
    hidden[1, 0] = torch.tensor([0.0, 1.0])
    hidden[1, 1] = torch.tensor([1.0, 1.0])
    span_ids = torch.full((2, 3, 4), OUTSIDE)
    span_ids[0, 0, 0], span_ids[1, 0, 1], span_ids[0, 1, 0], span_ids[1, 1, 1] = 0, 0, 1, 1  # row 2: no document
    t, r = 0.5, 1 / math.sqrt(2)
    logits = torch.tensor([[1.0, r], [0.0, r]]) / t  # a_i · b_j
    expected = (F.cross_entropy(logits, torch.arange(2)) + F.cross_entropy(logits.T, torch.arange(2))) / 2
    assert SpanContrast(1.0, t).loss(hidden, span_ids).item() == pytest.approx(expected.item(), abs=1e-6)
    one = span_ids.clone()
    one[one == 1] = OUTSIDE
    alone = hidden.clone().requires_grad_()
    loss = SpanContrast(1.0, t).loss(alone, one)
    loss.backward()
    assert loss.item() == 0.0 and (alone.grad == 0).all(), "one document: no pair to contrast, exactly 0"
    assert SpanContrast(1.0, t).loss(hidden, torch.full((2, 3, 4), OUTSIDE)).item() == 0.0


@pytest.mark.parametrize("architecture", ["roberta", "modernbert", "bert"])
def test_the_training_forward_adds_the_weighted_span_loss_to_the_unchanged_mlm_loss(architecture):
    tokenizer = TokenizerInfo("test", "sha256:0", 300, cls_id=0, sep_id=2, pad_id=1, mask_id=4, backend_json="{}")
    shape = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    nsp = {"next_sentence_loss": False} if architecture == "bert" else {}
    model_config = ModelConfig(architecture=architecture, **nsp, **shape)
    torch.manual_seed(0)
    model = build_model(model_config, tokenizer, SEQ_LEN, SpanContrast(0.3, 0.05))
    ids = torch.randint(5, 300, (4, SEQ_LEN))
    labels = torch.where(torch.rand(ids.shape) < 0.2, ids, IGNORE_INDEX)
    batch = {"input_ids": ids, **masked_slots(labels)}
    span_ids = torch.from_numpy(SpanSampler(CONFIG)(keys(range(4)), row_documents(4, SEQ_LEN)))
    plain, spans = model(**batch), model(**batch, span_ids=span_ids)
    assert torch.equal(spans["mlm_loss"], plain["loss"])
    assert spans["span_loss"] > 0
    torch.testing.assert_close(spans["loss"], plain["loss"] + 0.3 * spans["span_loss"])
    model.span_contrast = None
    with pytest.raises(ValueError, match="span_ids"):
        model(**batch, span_ids=span_ids)


def test_the_section_checks_its_keys_and_refuses_next_sentence_pairs():
    with pytest.raises(ValueError) as err:
        ContrastiveConfig(weight=-1, temperature=0, min_tokens=0, max_tokens=-1, min_fraction=0.6, max_fraction=0.5)
    for key in ("weight", "temperature", "min_tokens", "max_tokens", "min_fraction"):
        assert f"contrastive.{key}" in str(err.value)
    assert ContrastiveConfig().model_term is None and ContrastiveConfig(weight=0.1).model_term.weight == 0.1
    base = {"data": {"shards": "s", "tokenizer": "t"}, "contrastive": {"weight": 1.0}}
    _, problems = build_config(PretrainConfig, {**base, "model": {"architecture": "bert"}})
    assert [p for p in problems if p.startswith("contrastive.weight: BERT's next-sentence pair rows")]
    built, problems = build_config(PretrainConfig, {**base, "model": {"architecture": "bert",
                                                                      "next_sentence_loss": False}})
    assert not problems and built.contrastive.weight == 1.0


def test_the_batch_builder_adds_spans_of_the_packed_documents_and_changes_nothing_else(tmp_path, doc_packed_shards):
    from pipeline.data.token_cache import TokenCache
    from pipeline.pretrain.batches.stretch_data import MaskedBatches
    from pipeline.pretrain.plan.stream import MicroBatchKey

    cache = TokenCache(doc_packed_shards, "train", tmp_path / "cache")
    masker = Masker(400, 4, (0, 1, 2, 3, 4), seed=0)
    key = MicroBatchKey(0, np.array([5, 0, 17, 3]))
    plain = MaskedBatches(cache, masker, with_segments=False)[key]
    spans = MaskedBatches(cache, masker, with_segments=False, spans=SpanSampler(CONFIG))
    batch = spans[key]
    assert batch.keys() - plain.keys() == {"span_ids"}
    assert all(torch.equal(batch[k], plain[k]) for k in plain)
    assert torch.equal(batch["span_ids"], spans[key]["span_ids"])  # the key alone decides, as for the mask
    span_ids, documents = batch["span_ids"].numpy(), batch["document_ids"].numpy()
    assert span_ids.shape == (2, *documents.shape) and (documents[span_ids[0] != OUTSIDE] >= 0).all()
    assert set(spans_of(span_ids, 0)) == set(spans_of(span_ids, 1)) == set(range(4))


def test_the_preflight_refuses_pair_rows_and_rows_shorter_than_a_document(tmp_path, pairs_shards,
                                                                          wordpiece_tokenizer_dir, roberta_shards,
                                                                          bpe_tokenizer_dir):
    import json

    from helpers import tiny_pretrain_config

    from pipeline.common.errors import PipelineError
    from pipeline.pretrain.preflight import prepare_run

    cases = [(pairs_shards, wordpiece_tokenizer_dir, {"architecture": "bert", "next_sentence_loss": False}, {},
              "contrastive.weight: .* holds 'pairs' rows"),
             (roberta_shards, bpe_tokenizer_dir, {}, {"min_document_tokens": 100},
              "contrastive.min_document_tokens: 100 is more than the 64 tokens of a row")]
    for i, (shards, tokenizer, model, contrastive, refusal) in enumerate(cases):
        path = tmp_path / f"config{i}.json"
        path.write_text(json.dumps(tiny_pretrain_config(shards, tokenizer, tmp_path / "out", model=model,
                                                        contrastive={"weight": 1.0, **contrastive})))
        with pytest.raises(PipelineError, match=refusal):
            prepare_run(path, world_size=1)
