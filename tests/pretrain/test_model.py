"""The sparse MLM head: HF's parameter names, HF's loss to 1e-5, the FLOP model behind the speed-up, and its
static slots: the boolean-indexed head's loss and gradients, with nothing read back from the device."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import BertForPreTraining, ModernBertForMaskedLM, RobertaForMaskedLM, RobertaPreLayerNormForMaskedLM

from pipeline.data.tokenizer import TokenizerInfo
from pipeline.models.architectures.config import ModelConfig
from pipeline.models.architectures.flops import training_flops_per_token
from pipeline.models.architectures.hf_model import build_model, encode, first_position_id
from pipeline.models.architectures.packed_attention import document_layout
from pipeline.models.parameter_groups import parameter_groups
from pipeline.pretrain.batches.masked_slots import masked_slots, slot_bound
from pipeline.pretrain.config import MaskingConfig
from pipeline.pretrain.plan.masking import IGNORE_INDEX

TOKENIZER = TokenizerInfo("test", "sha256:0", 500, cls_id=0, sep_id=2, pad_id=1, mask_id=4, backend_json="{}")
SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def masked_batch(rows=4, length=32, seed=0, probability=0.15):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 500, (rows, length), generator=g)
    labels = torch.full_like(ids, IGNORE_INDEX)
    chosen = torch.rand(ids.shape, generator=g) < probability
    labels[chosen] = ids[chosen]
    return ids, labels


def test_roberta_loss_equals_hf_full_logit_loss_and_keys_match():
    torch.manual_seed(0)
    sparse = build_model(ModelConfig(architecture="roberta", **SMALL), TOKENIZER, seq_len=32).eval()
    reference = RobertaForMaskedLM(sparse.config).eval()
    assert list(reference.state_dict()) == list(sparse.state_dict())
    reference.load_state_dict(sparse.state_dict())
    ids, labels = masked_batch()
    ours = sparse(input_ids=ids, **masked_slots(labels))["loss"]
    theirs = reference(input_ids=ids, labels=labels).loss
    assert abs(ours.item() - theirs.item()) < 1e-5


@pytest.mark.parametrize("probability", [0.15, 0.30])
def test_pre_layernorm_roberta_loss_equals_hf_full_logit_loss_and_keys_match(probability):
    """Also at MosaicBERT's and ModernBERT's 30% masking rate: the sparse head gathers twice the rows."""
    torch.manual_seed(0)
    sparse = build_model(ModelConfig(architecture="roberta-prelayernorm", **SMALL), TOKENIZER, seq_len=32).eval()
    assert isinstance(sparse, RobertaPreLayerNormForMaskedLM) and sparse.config.model_type == "roberta-prelayernorm"
    reference = RobertaPreLayerNormForMaskedLM(sparse.config).eval()
    assert list(reference.state_dict()) == list(sparse.state_dict())
    reference.load_state_dict(sparse.state_dict())
    ids, labels = masked_batch(rows=8, probability=probability)
    assert abs((labels != IGNORE_INDEX).float().mean().item() - probability) < 0.05
    ours = sparse(input_ids=ids, **masked_slots(labels))["loss"]
    theirs = reference(input_ids=ids, labels=labels).loss
    assert abs(ours.item() - theirs.item()) < 1e-5
    # Pre-LN: LayerNorm before attention and the feed-forward, and a final one after the last layer.
    keys = sparse.state_dict()
    assert "roberta_prelayernorm.LayerNorm.weight" in keys
    assert "roberta_prelayernorm.encoder.layer.0.attention.LayerNorm.weight" in keys


def test_roberta_positions_leave_room_for_the_padding_offset():
    model = build_model(ModelConfig(**SMALL), TOKENIZER, seq_len=32)
    assert model.config.max_position_embeddings == 32 + TOKENIZER.pad_id + 1
    assert model.config.vocab_size == 500 and model.config._attn_implementation == "sdpa"


def test_bert_mlm_and_nsp_losses_equal_hf_and_keys_match():
    torch.manual_seed(0)
    sparse = build_model(ModelConfig(architecture="bert", **SMALL), TOKENIZER, seq_len=32).eval()
    reference = BertForPreTraining(sparse.config).eval()
    assert list(reference.state_dict()) == list(sparse.state_dict())
    reference.load_state_dict(sparse.state_dict())
    ids, labels = masked_batch()
    segments = (torch.arange(32) >= 16).long().expand(4, 32)
    nsp = torch.tensor([0, 1, 0, 1])
    ours = sparse(input_ids=ids, **masked_slots(labels), token_type_ids=segments, next_sentence_label=nsp)
    theirs = reference(input_ids=ids, labels=labels, token_type_ids=segments, next_sentence_label=nsp)
    assert abs(ours["loss"].item() - theirs.loss.item()) < 1e-5
    assert sparse.config.type_vocab_size == 2


def test_bert_without_next_sentence_loss_trains_mlm_alone_and_leaves_the_nsp_head_untouched():
    """The NSP ablation (model.next_sentence_loss false): same pairs batch, MLM loss only, no NSP gradient."""
    torch.manual_seed(0)
    both = build_model(ModelConfig(architecture="bert", **SMALL), TOKENIZER, seq_len=32).eval()
    mlm_only = build_model(ModelConfig(architecture="bert", next_sentence_loss=False, **SMALL), TOKENIZER,
                           seq_len=32).eval()
    mlm_only.load_state_dict(both.state_dict())
    ids, labels = masked_batch()
    batch = dict(input_ids=ids, **masked_slots(labels), token_type_ids=(torch.arange(32) >= 16).long().expand(4, 32),
                 next_sentence_label=torch.tensor([0, 1, 0, 1]))
    full, alone = both(**batch), mlm_only(**batch)
    assert "nsp_loss" not in alone and alone["loss"].item() == pytest.approx(full["mlm_loss"].item(), abs=1e-6)
    assert full["loss"].item() > alone["loss"].item()
    alone["loss"].backward()
    assert mlm_only.cls.seq_relationship.weight.grad is None
    assert "next_sentence_loss" not in mlm_only.config.to_dict()  # a training switch, not part of the export


@pytest.mark.parametrize("architecture", ["roberta", "roberta-prelayernorm", "bert"])
def test_no_weight_decay_on_biases_and_layer_norms(architecture):
    model = build_model(ModelConfig(architecture=architecture, **SMALL), TOKENIZER, seq_len=32)
    decay, no_decay = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim == 2 for p in decay["params"])
    assert all(names[id(p)].endswith(("bias", "LayerNorm.weight", "layer_norm.weight")) for p in no_decay["params"])
    # Every weight matrix decays, although each pre-LN name contains "prelayernorm".
    assert len(decay["params"]) == sum(p.ndim == 2 for p in model.parameters())
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.01


@pytest.mark.parametrize("vocab,expected_at_least", [(50_265, 2.0)])
def test_flop_model_predicts_the_sparse_head_saving_at_benchmark_size(vocab, expected_at_least):
    shape = dict(layers=4, hidden=256, intermediate=1024, seq_len=128, vocab=vocab)
    dense = training_flops_per_token(**shape, masked_fraction=None)
    sparse = training_flops_per_token(**shape, masked_fraction=0.15)
    assert dense / sparse > expected_at_least


MODERNBERT = dict(architecture="modernbert", num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                  intermediate_size=96, local_attention=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def test_modernbert_loss_equals_hf_full_logit_loss_at_30_percent_and_keys_match():
    """The pipeline's head at masked positions = ModernBertForMaskedLM's full-logit loss with labels (1e-5)."""
    torch.manual_seed(0)
    sparse = build_model(ModelConfig(**MODERNBERT), TOKENIZER, seq_len=64).eval()
    assert isinstance(sparse, ModernBertForMaskedLM) and sparse.config.model_type == "modernbert"
    reference = ModernBertForMaskedLM(sparse.config).eval()
    assert not reference.sparse_prediction  # the saved config gives full logits; the subclass gathers rows itself
    assert list(reference.state_dict()) == list(sparse.state_dict())
    reference.load_state_dict(sparse.state_dict())
    ids, labels = masked_batch(rows=4, length=64, probability=0.30)
    ours = sparse(input_ids=ids, **masked_slots(labels))["loss"]
    theirs = reference(input_ids=ids, labels=labels).loss
    assert abs(ours.item() - theirs.item()) < 1e-5
    # With padding too: the 2-D mask reaches both layer types.
    mask = torch.ones_like(ids)
    mask[:, 50:] = 0
    labels[:, 50:] = IGNORE_INDEX
    ours = sparse(input_ids=ids, **masked_slots(labels), attention_mask=mask)["loss"]
    assert abs(ours.item() - reference(input_ids=ids, labels=labels, attention_mask=mask).loss.item()) < 1e-5


def test_modernbert_takes_its_own_shape_keys_and_has_no_biases():
    model = build_model(ModelConfig(**{**MODERNBERT, "num_hidden_layers": 7, "global_attn_every_n_layers": 3,
                                       "global_rope_theta": 80_000.0, "local_rope_theta": 5_000.0}),
                        TOKENIZER, seq_len=64)
    c = model.config
    assert c.layer_types == ["full_attention", "sliding_attention", "sliding_attention"] * 2 + ["full_attention"]
    assert (c.local_attention, c.sliding_window) == (16, 8)
    assert c.rope_parameters["full_attention"]["rope_theta"] == 80_000.0
    assert c.rope_parameters["sliding_attention"]["rope_theta"] == 5_000.0
    assert model.model.layers[0].mlp.Wi.out_features == 2 * 96  # GeGLU: value and gate
    # Pre-norm without biases: only the decoder has one (ModernBERT's decoder_bias).
    assert [n for n, _ in model.named_parameters() if n.endswith("bias")] == ["decoder.bias"]
    assert (c.pad_token_id, c.cls_token_id, c.sep_token_id, c.vocab_size) == (1, 0, 2, 500)


def test_a_modernbert_export_tells_its_sequence_classifiers_to_pool_the_mean_unless_asked_for_cls():
    assert build_model(ModelConfig(**MODERNBERT), TOKENIZER, seq_len=64).config.classifier_pooling == "mean"
    cls = build_model(ModelConfig(**{**MODERNBERT, "classifier_pooling": "cls"}), TOKENIZER, seq_len=64)
    assert cls.config.classifier_pooling == "cls"


def test_modernbert_decays_weight_matrices_only():
    model = build_model(ModelConfig(**MODERNBERT), TOKENIZER, seq_len=64)
    decay, no_decay = parameter_groups(model, 0.01)
    assert len(decay["params"]) == sum(p.ndim == 2 for p in model.parameters())
    assert all(p.ndim == 1 for p in no_decay["params"])  # norms' weights and the decoder's bias


def test_modernbert_flops_count_geglu_and_the_local_window():
    from pipeline.models.architectures.flops import mean_keys_per_query, model_flops_per_token

    assert mean_keys_per_query(128, None) == 128 and mean_keys_per_query(128, 200) == 128
    assert mean_keys_per_query(5, 1) == (2 + 3 + 3 + 3 + 2) / 5
    model = build_model(ModelConfig(**MODERNBERT), TOKENIZER, seq_len=64)
    shape = dict(layers=3, hidden=64, intermediate=96, seq_len=64, vocab=500, masked_fraction=0.3)
    counted = model_flops_per_token(model.config, 64, 0.3)
    assert counted == training_flops_per_token(**shape, glu=True, local_layers=2, half_window=8)
    # GeGLU adds H·I per layer; two windowed layers see 17 keys or fewer instead of 64.
    plain = training_flops_per_token(**shape)
    windowless = training_flops_per_token(**shape, glu=True)
    assert windowless - plain == pytest.approx(6 * 3 * 64 * 96)
    assert counted < windowless


# ---------------------------------------------------------------- the head at static slots

ARCHITECTURES = ("roberta", "roberta-prelayernorm", "bert", "modernbert")
ROWS = ("full", "padded", "packed")
DEVICE_READS = ("aten.nonzero", "aten._local_scalar_dense", "aten.masked_select", "aten.unique")
INDEX_OPS = ("aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_")


def training_model(architecture: str) -> torch.nn.Module:
    torch.manual_seed(0)
    keys = MODERNBERT if architecture == "modernbert" else {**SMALL, "architecture": architecture}
    return build_model(ModelConfig(**keys), TOKENIZER, seq_len=32).train()


def rows_of(kind: str, architecture: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(input ids, per-position labels, the encoder's other inputs) for full, padded or doc-packed rows, with
    BERT's segment pairs and next-sentence labels."""
    ids, labels = masked_batch(seed=seed, probability=0.3)
    inputs: dict[str, torch.Tensor] = {}
    lengths = np.array([32, 20, 25, 9])
    if kind == "padded":
        inputs["attention_mask"] = torch.from_numpy((np.arange(32)[None] < lengths[:, None]).astype(np.int64))
    if kind == "packed":
        starts = np.array([[0, 10, -1], [0, 5, 12], [0, -1, -1], [0, 3, -1]])
        documents, positions = document_layout(starts, lengths, 32, first_position_id(architecture, TOKENIZER.pad_id))
        inputs["document_ids"], inputs["position_ids"] = torch.from_numpy(documents), torch.from_numpy(positions)
    if kind != "full":
        ids[torch.from_numpy(np.arange(32)[None] >= lengths[:, None])] = TOKENIZER.pad_id
        labels[ids == TOKENIZER.pad_id] = IGNORE_INDEX
    if architecture == "bert":
        inputs["token_type_ids"] = (torch.arange(32) >= 16).long().expand(4, 32)
        inputs["next_sentence_label"] = torch.tensor([0, 1, 0, 1])
    return ids, labels, inputs


def boolean_indexed_mlm_loss(model, ids: torch.Tensor, labels: torch.Tensor, inputs: dict) -> torch.Tensor:
    """The head as it was: hidden states picked by `labels != IGNORE_INDEX` (a `nonzero`: a device→host sync and a
    data-dependent shape), on transformers' own padding mask; the mean cross-entropy over masked tokens."""
    if isinstance(model, ModernBertForMaskedLM):
        encoder, head = model.model, (lambda rows: model.decoder(model.head(rows)))
    elif isinstance(model, BertForPreTraining):
        encoder, head = model.bert, model.cls.predictions
    else:
        encoder, head = getattr(model, model.base_model_prefix), model.lm_head
    encoder_inputs = {k: v for k, v in inputs.items() if k != "next_sentence_label"}
    if "document_ids" in inputs:
        hidden = encode(encoder, ids, **encoder_inputs).last_hidden_state
    else:
        hidden = encoder(input_ids=ids, **encoder_inputs).last_hidden_state
    picked = labels != IGNORE_INDEX
    return F.cross_entropy(head(hidden[picked]).float(), labels[picked])


def mlm_loss(out: dict) -> torch.Tensor:
    return out.get("mlm_loss", out["loss"])


def gradients(model) -> dict[str, torch.Tensor]:
    found = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return found


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_slot_head_gives_the_boolean_indexed_heads_loss_and_gradients(architecture, rows):
    model = training_model(architecture)
    ids, labels, inputs = rows_of(rows, architecture)
    old = boolean_indexed_mlm_loss(model, ids, labels, inputs)
    old.backward()
    expected = gradients(model)
    new = mlm_loss(model(input_ids=ids, **masked_slots(labels), **inputs))
    assert new.item() == pytest.approx(old.item(), abs=1e-5)
    new.backward()
    found = gradients(model)
    assert set(found) == set(expected)
    for name, grad in expected.items():
        torch.testing.assert_close(found[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_leftover_slots_change_neither_the_loss_nor_the_gradients(architecture):
    model = training_model(architecture)
    ids, labels, inputs = rows_of("padded", architecture)
    few, many = masked_slots(labels, bound=64), masked_slots(labels, bound=1024)
    assert len(many["masked_positions"]) == 128 > len(few["masked_positions"])  # capped at every position
    losses, grads = [], []
    for slots in (few, many):
        losses.append(mlm_loss(model(input_ids=ids, **slots, **inputs)))
        losses[-1].backward()
        grads.append(gradients(model))
    assert losses[0].item() == pytest.approx(losses[1].item(), abs=1e-6)
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_masked_logits_are_the_real_masked_positions_in_row_major_order(architecture):
    model = training_model(architecture).eval()
    ids, labels, inputs = rows_of("packed", architecture)
    with torch.no_grad():
        logits = model.masked_logits(input_ids=ids, **masked_slots(labels), **inputs)
    assert logits.shape == (int((labels != IGNORE_INDEX).sum()), TOKENIZER.vocab_size)
    old = F.cross_entropy(logits.float(), labels[labels != IGNORE_INDEX])  # the targets in row-major order
    assert old.item() == pytest.approx(boolean_indexed_mlm_loss(model, ids, labels, inputs).item(), abs=1e-5)


class DeviceReads(TorchDispatchMode):
    """Records every op that reads a tensor's values on the host (on a GPU, a device→host sync): `nonzero`,
    `.item()` and the like, and an index by a boolean mask, whose `nonzero` runs inside `aten.index`."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        boolean_index = name in INDEX_OPS and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                                  for i in args[1] if i is not None)
        if name in DEVICE_READS or boolean_index:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def device_reads(step) -> list[str]:
    with DeviceReads() as reads:
        step()
    return reads.seen


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_a_training_forward_and_backward_reads_nothing_back_from_the_device(architecture, rows):
    model = training_model(architecture)
    ids, labels, inputs = rows_of(rows, architecture)
    batch = {"input_ids": ids, **masked_slots(labels, slot_bound(ids.numel(), 0.3, MaskingConfig())), **inputs}
    assert device_reads(lambda: model(**batch)["loss"].backward()) == []
    # The boolean-indexed head it replaced reads the mask back (on transformers' own padding mask, that too).
    assert device_reads(lambda: boolean_indexed_mlm_loss(model, ids, labels, inputs).backward())


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_a_compiled_training_step_is_one_graph_for_every_micro_batch_of_a_shape(architecture):
    """Whole-graph capture (no break at the head) and no recompile across masks; the next bucket is one more graph."""
    from torch._dynamo.utils import counters

    model = training_model(architecture)
    bound = 64  # half the positions: slot_bound of so small a batch is every position, which leaves no next bucket
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # graph capture only: no C++ compiler
    try:
        masked = set()
        for seed in (0, 1):
            ids, labels, inputs = rows_of("padded", architecture, seed)
            masked.add(int((labels != IGNORE_INDEX).sum()))
            compiled(input_ids=ids, **masked_slots(labels, bound), **inputs)["loss"].backward()
        assert len(masked) == 2 and counters["stats"]["unique_graphs"] == 1
        everything = torch.where(ids != TOKENIZER.pad_id, ids, IGNORE_INDEX)  # more than the bound: the next bucket
        assert len(masked_slots(everything, bound)["masked_positions"]) == 2 * bound
        compiled(input_ids=ids, **masked_slots(everything, bound), **inputs)["loss"].backward()
        assert counters["stats"]["unique_graphs"] == 2
    finally:
        torch._dynamo.reset()
