"""`doc-packed` rows: several whole documents per row, each attending only to itself.

The specification is the equivalence: a packed row computes, for each of its documents, what that
document computes when run alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.data.packers import make_packer
from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
from pipeline.models.architectures.config import ModelConfig
from pipeline.models.architectures.hf_model import SPARSE_CLASSES, encode, hf_config
from pipeline.models.architectures.packed_attention import document_layout
from pipeline.pretrain.batches.masked_slots import masked_slots
from pipeline.pretrain.config import MaskingConfig
from pipeline.pretrain.plan.masking import IGNORE_INDEX, Masker

CLS, SEP, PAD = 0, 2, 1


def documents(n: int, seed: int = 0, longest: int = 40) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(5, 300, size=int(rng.integers(1, longest))).astype(np.int64) for _ in range(n)]


def pack(docs: list[np.ndarray], seq_len: int = 64, **kwargs):
    packer = make_packer("doc-packed", seq_len, CLS, SEP, PAD, np.uint16, **kwargs)
    flat = np.concatenate(docs) if docs else np.zeros(0, np.int64)
    out = packer.add(flat, np.array([len(d) for d in docs]))
    rest = packer.finish()
    return {k: np.concatenate([out[k], rest[k]]) for k in out}, packer


def unpack(rows) -> list[list[int]]:
    """The framed documents of every row, in row order."""
    found = []
    for ids, length, starts in zip(rows["input_ids"], rows["length"], rows["doc_starts"], strict=True):
        bounds = [s for s in starts.tolist() if s >= 0] + [int(length)]
        found += [ids[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:], strict=False)]
    return found


def test_every_document_appears_once_framed_as_it_would_be_alone():
    docs = documents(300)
    rows, packer = pack(docs)
    framed = sorted(tuple([CLS, *d.tolist(), SEP]) for d in docs)
    assert sorted(map(tuple, unpack(rows))) == framed
    # padding only at the end of a row
    assert (rows["input_ids"][np.arange(64)[None, :] >= rows["length"][:, None]] == PAD).all()
    assert packer.stats.documents == 300


def test_a_document_longer_than_a_row_is_split_as_in_doc_mode():
    long = np.arange(5, 5 + 150)
    rows, _ = pack([long], seq_len=64)
    pieces = unpack(rows)
    assert [len(p) for p in pieces] == [64, 64, 150 - 2 * 62 + 2]
    assert sum((p[1:-1] for p in pieces), []) == long.tolist()


def test_packing_wastes_far_less_than_padding_each_document():
    docs = documents(2000, longest=50)
    rows, packer = pack(docs)
    doc = make_packer("doc", 64, CLS, SEP, PAD, np.uint16)
    doc.add(np.concatenate(docs), np.array([len(d) for d in docs]))
    packed_waste = packer.stats.padding_tokens / (packer.stats.sequences * 64)
    padded_waste = doc.stats.padding_tokens / (doc.stats.sequences * 64)
    assert packed_waste < 0.05 < 0.4 < padded_waste


def test_a_packer_resumed_from_its_state_writes_the_same_rows():
    docs = documents(400)
    whole, _ = pack(docs)
    first = make_packer("doc-packed", 64, CLS, SEP, PAD, np.uint16)
    a = first.add(np.concatenate(docs[:150]), np.array([len(d) for d in docs[:150]]))
    scalars, arrays = first.state()
    second = make_packer("doc-packed", 64, CLS, SEP, PAD, np.uint16)
    second.load_state(scalars, arrays)
    b = second.add(np.concatenate(docs[150:]), np.array([len(d) for d in docs[150:]]))
    c = second.finish()
    for key in whole:
        assert np.array_equal(np.concatenate([a[key], b[key], c[key]]), whole[key])


def test_positions_restart_at_every_document_from_the_architectures_first_position():
    starts = np.array([[0, 5, 9, -1]])
    documents_, positions = document_layout(starts, np.array([12]), seq_len=16, position_offset=2)
    assert documents_.tolist() == [[0] * 5 + [1] * 4 + [2] * 3 + [-1] * 4]
    assert positions.tolist() == [[2, 3, 4, 5, 6, 2, 3, 4, 5, 2, 3, 4, 1, 1, 1, 1]]


def test_masks_never_fall_on_a_neighbours_framing_tokens(bpe_tokenizer_dir):
    info = describe_tokenizer(load_tokenizer(bpe_tokenizer_dir))
    rows, _ = pack(documents(200))
    masker = Masker(400, info.mask_id, (CLS, PAD, SEP, info.mask_id), seed=0, masking=MaskingConfig(probability=0.5))
    _, labels = masker(rows["input_ids"].astype(np.int64), 0, np.arange(len(rows["input_ids"])))
    framing = np.isin(rows["input_ids"], [CLS, SEP, PAD])
    assert (labels[framing] == IGNORE_INDEX).all() and (labels != IGNORE_INDEX).mean() > 0.3


@pytest.mark.parametrize("architecture", ["roberta", "bert"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_packed_row_equals_its_documents_run_alone(architecture, attention, bpe_tokenizer_dir):
    info = describe_tokenizer(load_tokenizer(bpe_tokenizer_dir))
    config = hf_config(ModelConfig(architecture=architecture, num_hidden_layers=2, hidden_size=64,
                                   num_attention_heads=4, intermediate_size=128, attn_implementation=attention),
                       info, seq_len=64)
    torch.manual_seed(0)
    model = SPARSE_CLASSES[architecture](config).eval()
    encoder = model.roberta if architecture == "roberta" else model.bert
    offset = info.pad_id + 1 if architecture == "roberta" else 0
    docs = [d % (info.vocab_size - 10) + 10 for d in documents(12, seed=3)]
    rows, _ = _pack_with(docs, info)
    document_ids, position_ids = document_layout(rows["doc_starts"], rows["length"].astype(np.int64), 64, offset)
    ids = torch.from_numpy(rows["input_ids"].astype(np.int64))
    with torch.no_grad():
        packed = encode(encoder, ids, document_ids=torch.from_numpy(document_ids),
                        position_ids=torch.from_numpy(position_ids)).last_hidden_state
        worst = 0.0
        for r, (starts, length) in enumerate(zip(rows["doc_starts"], rows["length"], strict=True)):
            bounds = [s for s in starts.tolist() if s >= 0] + [int(length)]
            for a, b in zip(bounds[:-1], bounds[1:], strict=False):
                alone = encode(encoder, ids[r: r + 1, a:b]).last_hidden_state[0]
                worst = max(worst, (alone - packed[r, a:b]).abs().max().item())
    assert worst < 1e-5


def _pack_with(docs, info, seq_len: int = 64):
    packer = make_packer("doc-packed", seq_len, info.cls_id, info.sep_id, info.pad_id, np.uint16)
    out = packer.add(np.concatenate(docs), np.array([len(d) for d in docs]))
    rest = packer.finish()
    return {k: np.concatenate([out[k], rest[k]]) for k in out}, packer


def test_the_sparse_mlm_loss_of_a_packed_row_equals_the_loss_over_its_documents(bpe_tokenizer_dir):
    info = describe_tokenizer(load_tokenizer(bpe_tokenizer_dir))
    config = hf_config(ModelConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                   intermediate_size=128), info, seq_len=64)
    torch.manual_seed(0)
    model = SPARSE_CLASSES["roberta"](config).eval()
    docs = [d % (info.vocab_size - 10) + 10 for d in documents(10, seed=5)]
    rows, _ = _pack_with(docs, info)
    masker = Masker(info.vocab_size, info.mask_id, (info.cls_id, info.sep_id, info.pad_id, info.mask_id), seed=1,
                    masking=MaskingConfig(probability=0.3))
    corrupted, labels = masker(rows["input_ids"].astype(np.int64), 0, np.arange(len(rows["input_ids"])))
    document_ids, position_ids = document_layout(rows["doc_starts"], rows["length"].astype(np.int64), 64,
                                                 info.pad_id + 1)
    with torch.no_grad():
        packed = model(torch.from_numpy(corrupted), **masked_slots(labels),
                       document_ids=torch.from_numpy(document_ids),
                       position_ids=torch.from_numpy(position_ids))["loss"]
        total, count = 0.0, 0
        for r, (starts, length) in enumerate(zip(rows["doc_starts"], rows["length"], strict=True)):
            bounds = [s for s in starts.tolist() if s >= 0] + [int(length)]
            for a, b in zip(bounds[:-1], bounds[1:], strict=False):
                doc_labels = torch.from_numpy(labels[r: r + 1, a:b])
                n = int((doc_labels != IGNORE_INDEX).sum())
                if n:
                    loss = model(torch.from_numpy(corrupted[r: r + 1, a:b]), **masked_slots(doc_labels))["loss"]
                    total, count = total + loss.item() * n, count + n
    assert abs(packed.item() - total / count) < 1e-5


@pytest.mark.slow
def test_pretraining_runs_on_doc_packed_shards_through_the_trainer(tmp_path, corpus_jsonl, bpe_tokenizer_dir):
    """The shard stage's doc-packed rows reach the model through the trainer, as a user runs it."""
    import json
    import subprocess

    from helpers import PYTHON, ROOT, tiny_pretrain_config

    from pipeline.data.shards.options import ShardOptions
    from pipeline.data.shards.stage import run_shard_stage

    shards = tmp_path / "shards"
    index = run_shard_stage(ShardOptions(inputs=(str(corpus_jsonl),), tokenizer=str(bpe_tokenizer_dir), seq_len=64,
                                         out=str(shards), pack="doc-packed", workers=1, shard_size=100,
                                         val_fraction=0.1, quiet=True))
    assert index["totals"]["padding_fraction"] < 0.1
    config = tiny_pretrain_config(shards, bpe_tokenizer_dir, tmp_path / "run", train={"max_steps": 3})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    proc = subprocess.run([PYTHON, str(ROOT / "launchers/pretrain.py"), "--config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r]
    assert len(steps) == 3 and all(np.isfinite(r["train/loss"]) for r in steps)
    assert any("eval/mlm_loss" in r for r in records)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_packed_modernbert_row_equals_its_documents_run_alone(attention, bpe_tokenizer_dir):
    """Rotary positions restart per document, attention stays inside it, and so does the local window.

    The window (8 tokens either side) is shorter than most documents, so a packed row that let the
    window cross a document boundary, or applied it from the row's start, would differ.
    """
    from pipeline.models.architectures.hf_model import encode, first_position_id

    info = describe_tokenizer(load_tokenizer(bpe_tokenizer_dir))
    config = hf_config(ModelConfig(architecture="modernbert", num_hidden_layers=3, hidden_size=64,
                                   num_attention_heads=4, intermediate_size=96, local_attention=16,
                                   attn_implementation=attention), info, seq_len=64)
    torch.manual_seed(0)
    model = SPARSE_CLASSES["modernbert"](config).eval()
    docs = [d % (info.vocab_size - 10) + 10 for d in documents(12, seed=3)]
    assert sum(len(d) > 20 for d in docs) >= 4
    rows, _ = _pack_with(docs, info)
    assert first_position_id("modernbert", info.pad_id) == 0
    document_ids, position_ids = document_layout(rows["doc_starts"], rows["length"].astype(np.int64), 64, 0)
    ids = torch.from_numpy(rows["input_ids"].astype(np.int64))
    with torch.no_grad():
        packed = encode(model.model, ids, document_ids=torch.from_numpy(document_ids),
                        position_ids=torch.from_numpy(position_ids)).last_hidden_state
        no_window = encode(model.model, ids, attention_mask=torch.from_numpy(document_ids >= 0).long())
        worst, compared = 0.0, 0
        for r, (starts, length) in enumerate(zip(rows["doc_starts"], rows["length"], strict=True)):
            bounds = [s for s in starts.tolist() if s >= 0] + [int(length)]
            for a, b in zip(bounds[:-1], bounds[1:], strict=False):
                alone = encode(model.model, ids[r: r + 1, a:b]).last_hidden_state[0]
                worst = max(worst, (alone - packed[r, a:b]).abs().max().item())
                compared += 1
    assert compared >= 12 and worst < 1e-5
    # The same rows without per-document attention compute something else: the check can fail.
    assert (no_window.last_hidden_state - packed).abs().max().item() > 1e-2


def test_the_modernbert_loss_of_a_packed_row_equals_the_loss_over_its_documents(bpe_tokenizer_dir):
    info = describe_tokenizer(load_tokenizer(bpe_tokenizer_dir))
    config = hf_config(ModelConfig(architecture="modernbert", num_hidden_layers=3, hidden_size=64,
                                   num_attention_heads=4, intermediate_size=96, local_attention=16), info, seq_len=64)
    torch.manual_seed(0)
    model = SPARSE_CLASSES["modernbert"](config).eval()
    docs = [d % (info.vocab_size - 10) + 10 for d in documents(10, seed=5)]
    rows, _ = _pack_with(docs, info)
    masker = Masker(info.vocab_size, info.mask_id, (info.cls_id, info.sep_id, info.pad_id, info.mask_id), seed=1,
                    masking=MaskingConfig(probability=0.3))
    corrupted, labels = masker(rows["input_ids"].astype(np.int64), 0, np.arange(len(rows["input_ids"])))
    document_ids, position_ids = document_layout(rows["doc_starts"], rows["length"].astype(np.int64), 64, 0)
    with torch.no_grad():
        packed = model(torch.from_numpy(corrupted), **masked_slots(labels),
                       document_ids=torch.from_numpy(document_ids), position_ids=torch.from_numpy(position_ids))["loss"]
        total, count = 0.0, 0
        for r, (starts, length) in enumerate(zip(rows["doc_starts"], rows["length"], strict=True)):
            bounds = [s for s in starts.tolist() if s >= 0] + [int(length)]
            for a, b in zip(bounds[:-1], bounds[1:], strict=False):
                doc_labels = torch.from_numpy(labels[r: r + 1, a:b])
                n = int((doc_labels != IGNORE_INDEX).sum())
                if n:
                    loss = model(torch.from_numpy(corrupted[r: r + 1, a:b]), **masked_slots(doc_labels))["loss"]
                    total, count = total + loss.item() * n, count + n
    assert abs(packed.item() - total / count) < 1e-5


def test_flash_attention_inputs_for_modernbert_are_the_varlen_segments():
    """The GPU path (not run here): one flattened row, segments per document, no mask; the window goes to the kernel."""
    from pipeline.models.architectures.packed_attention import encoder_inputs

    document_ids = torch.tensor([[0, 0, 0, 1, 1, -1], [0, 0, 0, 0, 1, 1]])
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]])
    inputs = encoder_inputs(torch.zeros(2, 6, dtype=torch.long), document_ids, position_ids, "flash_attention_2",
                            half_window=64)
    assert inputs["input_ids"].shape == (1, 12) and inputs["attention_mask"] is None
    assert inputs["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 10, 12] and inputs["max_length_q"] == 4
    sdpa = encoder_inputs(torch.zeros(2, 6, dtype=torch.long), document_ids, position_ids, "sdpa", half_window=1)
    local = sdpa["attention_mask"]["sliding_attention"][1, 0]
    assert local[0].tolist() == [True, True, False, False, False, False]  # the window, inside document 0
    assert local[3].tolist() == [False, False, True, True, False, False]  # and never across into document 1


def _cpu_compiler() -> bool:
    """transformers compiles FlexAttention (inductor), which on CPU needs a C++ compiler."""
    from torch._inductor import exc
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        return False
    return True


needs_flex = pytest.mark.skipif(not _cpu_compiler(), reason="FlexAttention on CPU compiles with inductor: no C++ "
                                                             "compiler here; the mask tests below still run")


@pytest.mark.parametrize("half_window", [None, 0, 2, 100])
def test_the_flex_mask_rule_is_the_dense_masks_truth_table(half_window):
    """mask_mod over every (row, query, key) equals the SDPA path's block-diagonal mask (and window band)."""
    from pipeline.models.architectures.packed_attention import (
        block_diagonal_mask,
        document_mask_mod,
        sliding_window_band,
    )

    document_ids = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1], [0, 0, 0, 0, 0, 1, 1, 1]])
    b, q, kv = torch.arange(2)[:, None, None], torch.arange(8)[None, :, None], torch.arange(8)[None, None, :]
    rule = document_mask_mod(document_ids, half_window)(b, 0, q, kv)
    dense = block_diagonal_mask(document_ids)[:, 0]
    if half_window is not None:
        dense = dense & sliding_window_band(8, half_window)
    assert torch.equal(rule, dense)
    assert rule.any(-1).all()  # no query row is empty: padding attends to padding


def test_the_flex_inputs_are_block_masks_one_per_modernbert_layer_type():
    from torch.nn.attention.flex_attention import BlockMask

    from pipeline.models.architectures.packed_attention import encoder_inputs

    document_ids = torch.tensor([[0, 0, 0, 1, 1, -1]])
    ids, positions = torch.zeros(1, 6, dtype=torch.long), torch.tensor([[0, 1, 2, 0, 1, 0]])
    assert isinstance(encoder_inputs(ids, document_ids, positions, "flex_attention")["attention_mask"], BlockMask)
    masks = encoder_inputs(ids, document_ids, positions, "flex_attention", half_window=1)["attention_mask"]
    assert set(masks) == {"full_attention", "sliding_attention"}
    assert all(isinstance(m, BlockMask) for m in masks.values())
    # The block mask's own dense view (one 128-block here) cannot show the window; its mask_mod can.
    assert masks["sliding_attention"].mask_mod(0, 0, torch.tensor(0), torch.tensor(2)).item() is False
    assert masks["full_attention"].mask_mod(0, 0, torch.tensor(0), torch.tensor(2)).item() is True


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_dense_masks_are_made_on_the_documents_device(attention):
    """The meta device stands in for CUDA here: a mask made on the CPU beside GPU scores fails every step."""
    from pipeline.models.architectures.packed_attention import encoder_inputs

    document_ids = torch.tensor([[0, 0, 0, 1, 1, -1]], device="meta")
    ids, positions = torch.zeros(1, 6, dtype=torch.long, device="meta"), torch.zeros(1, 6, device="meta")
    assert encoder_inputs(ids, document_ids, positions, attention)["attention_mask"].device.type == "meta"
    masks = encoder_inputs(ids, document_ids, positions, attention, half_window=1)["attention_mask"]
    assert {m.device.type for m in masks.values()} == {"meta"}


@pytest.mark.parametrize("architecture", ["roberta", "modernbert"])
def test_a_dense_mask_can_never_reach_the_flex_path(architecture, bpe_tokenizer_dir):
    """transformers' flex path ADDS a tensor mask to the scores: a boolean mask there is refused, not used."""
    from pipeline.common.errors import PipelineError
    from pipeline.models.architectures.hf_model import encode
    from pipeline.models.architectures.packed_attention import block_diagonal_mask, check_flex_mask

    info = describe_tokenizer(load_tokenizer(bpe_tokenizer_dir))
    window = {"local_attention": 4} if architecture == "modernbert" else {}  # a key of ModernBERT's alone
    config = hf_config(ModelConfig(architecture=architecture, num_hidden_layers=1, hidden_size=32,
                                   num_attention_heads=2, intermediate_size=64, attention_probs_dropout_prob=0.0,
                                   attn_implementation="flex_attention", **window), info, seq_len=16)
    model = SPARSE_CLASSES[architecture](config).eval()
    ids = torch.full((1, 8), 10)
    dense = block_diagonal_mask(torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]]))
    with pytest.raises(PipelineError, match="dense mask .*adds a tensor mask"):
        encode(model.roberta if architecture == "roberta" else model.model, ids, attention_mask=dense)
    with pytest.raises(PipelineError, match="dense mask"):
        model(ids, **masked_slots(torch.full((1, 8), IGNORE_INDEX)), attention_mask=dense.float())
    with pytest.raises(PipelineError, match=r"attention_mask\['sliding_attention'\]"):
        check_flex_mask({"full_attention": None, "sliding_attention": dense})
    check_flex_mask(torch.ones(1, 8, dtype=torch.long))  # a 2-D padding mask: transformers builds the BlockMask


@needs_flex
@pytest.mark.parametrize("architecture", ["roberta", "bert", "modernbert"])
def test_a_flex_packed_row_equals_its_documents_run_alone_with_sdpa(architecture, bpe_tokenizer_dir):
    """The flex path, per document, against the SDPA path on each document alone (same weights)."""
    import copy

    from pipeline.models.architectures.hf_model import encode, first_position_id

    info = describe_tokenizer(load_tokenizer(bpe_tokenizer_dir))
    window = {"local_attention": 16} if architecture == "modernbert" else {}  # a key of ModernBERT's alone
    flex_config = hf_config(ModelConfig(architecture=architecture, num_hidden_layers=3, hidden_size=64,
                                        num_attention_heads=4, intermediate_size=96, attention_probs_dropout_prob=0.0,
                                        attn_implementation="flex_attention", **window), info, seq_len=64)
    sdpa_config = copy.deepcopy(flex_config)
    sdpa_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    flex = SPARSE_CLASSES[architecture](flex_config).eval()
    sdpa = SPARSE_CLASSES[architecture](sdpa_config).eval()
    sdpa.load_state_dict(flex.state_dict())
    pick = {"roberta": "roberta", "bert": "bert", "modernbert": "model"}[architecture]
    docs = [d % (info.vocab_size - 10) + 10 for d in documents(12, seed=3)]
    rows, _ = _pack_with(docs, info)
    offset = first_position_id(architecture, info.pad_id)
    document_ids, position_ids = document_layout(rows["doc_starts"], rows["length"].astype(np.int64), 64, offset)
    ids = torch.from_numpy(rows["input_ids"].astype(np.int64))
    with torch.no_grad():
        packed = encode(getattr(flex, pick), ids, document_ids=torch.from_numpy(document_ids),
                        position_ids=torch.from_numpy(position_ids)).last_hidden_state
        worst, compared = 0.0, 0
        for r, (starts, length) in enumerate(zip(rows["doc_starts"], rows["length"], strict=True)):
            bounds = [s for s in starts.tolist() if s >= 0] + [int(length)]
            for a, b in zip(bounds[:-1], bounds[1:], strict=False):
                alone = encode(getattr(sdpa, pick), ids[r: r + 1, a:b]).last_hidden_state[0]
                worst = max(worst, (alone - packed[r, a:b]).abs().max().item())
                compared += 1
    assert compared >= 12 and worst < 1e-4


def test_flex_attention_is_refused_up_front_on_cpu_and_with_attention_dropout(tmp_path):
    """FlexAttention has no backward on CPU, and transformers' flex path no attention dropout: both at load."""
    import json

    from helpers import tiny_pretrain_config

    from pipeline.common.config.tree import ConfigError
    from pipeline.pretrain.preflight import load_pretrain_config

    data = tiny_pretrain_config(tmp_path / "missing", tmp_path / "tok", tmp_path / "out",
                                model={"attn_implementation": "flex_attention", "attention_probs_dropout_prob": 0.1})
    (tmp_path / "c.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="model.attn_implementation flex_attention: FlexAttention has no backward "
                                          "on CPU.*use sdpa on CPU") as err:
        load_pretrain_config(tmp_path / "c.json", cuda=False)
    assert "model.attention_probs_dropout_prob: flex_attention has no attention dropout, got 0.1" in str(err.value)


def test_a_flex_model_cannot_train_on_cpu_which_is_why_the_check_exists(bpe_tokenizer_dir):
    """If torch learns FlexAttention's CPU backward, this fails: then the up-front refusal above can go."""
    info = describe_tokenizer(load_tokenizer(bpe_tokenizer_dir))
    config = hf_config(ModelConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                   attention_probs_dropout_prob=0.0, attn_implementation="flex_attention"),
                       info, seq_len=16)
    model = SPARSE_CLASSES["roberta"](config).train()
    labels = torch.full((1, 8), IGNORE_INDEX)
    labels[0, 3] = 12
    document_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
    position_ids = torch.tensor([[2, 3, 4, 5, 2, 3, 4, 5]])
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        model(torch.full((1, 8), 10), **masked_slots(labels), document_ids=document_ids,
              position_ids=position_ids)["loss"].backward()
