"""Pretraining's in-loop probes: what a live model gives equals what the offline commands give on its saved folder;
the model keeps its training mode; a bad probe file or a name that would collide is refused before the run starts.
(tests/pretrain/test_pretrain_distributed.py shows the probes' curves in metrics.jsonl and MLflow from a real run.)"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import probe_files, tiny_pretrain_config

from pipeline.common.config.tree import ConfigError, SectionProblems
from pipeline.hub.quality_probes import QualityProbes, probe_problems
from pipeline.pretrain.config import ProbesConfig
from pipeline.pretrain.preflight import load_pretrain_config


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture(scope="module")
def probe_files_made(tmp_path_factory, documents):
    return probe_files(tmp_path_factory.mktemp("probes"), documents)


def test_live_probes_equal_the_offline_figures_of_the_saved_model_and_keep_training_mode(
        tmp_path, roberta_shards, bpe_tokenizer_dir, probe_files_made):
    from transformers import RobertaConfig, RobertaForMaskedLM

    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.hub import Encoder
    from pipeline.hub.cloze import cloze_score, validation_texts
    from pipeline.hub.embedding_evaluation import probe_model, read_probes
    from pipeline.hub.minimal_pairs import accuracy, pair_scores, read_pairs

    tokenizer = load_tokenizer(bpe_tokenizer_dir)
    torch.manual_seed(0)
    model = RobertaForMaskedLM(RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=64, max_position_embeddings=66,
                                             pad_token_id=tokenizer.pad_token_id)).train()
    probes = QualityProbes(ProbesConfig(cloze_texts=8, **probe_files_made), tokenizer, str(roberta_shards), 0.15)
    figures = probes.run(model)
    assert model.training  # the loop's model goes on training with dropout
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    offline = Encoder.from_pretrained(tmp_path / "model")
    cloze = cloze_score(offline, validation_texts(roberta_shards, tokenizer)[:8], mask_rate=0.15)
    assert figures["probe/cloze/top1"] == cloze.accuracy and figures["probe/cloze/constant"] == cloze.constant_accuracy
    pairs = read_pairs(probe_files_made["minimal_pairs"][0])
    assert figures["probe/minimal_pairs/minimal_pairs"] == accuracy(pair_scores(pairs, offline.score))["accuracy"]
    files = read_probes(retrieval=probe_files_made["retrieval"], sts=probe_files_made["sts"])
    embedded = probe_model(offline.model, tokenizer, files, max_seq_len=64)
    for key, value in embedded.items():
        assert figures[f"probe/{key}"] == pytest.approx(value, abs=1e-6), key
    assert 0 <= figures["probe/retrieval/retrieval/bm25/ndcg_at_10"] <= 1  # BM25 beside the model
    line = QualityProbes.line(figures)
    assert line.startswith("cloze top-1 ") and "minimal pairs minimal_pairs " in line
    assert "retrieval nDCG@10 " in line and "(BM25 " in line and "sts Spearman " in line


def test_probe_names_that_would_collide_or_break_a_metric_key_are_refused():
    with pytest.raises(SectionProblems, match=r"probes.retrieval: two files share a name before their first '.'"):
        ProbesConfig(retrieval=["a/search.jsonl", "b/search.jsonl.gz"])
    with pytest.raises(SectionProblems, match=r"probes.sts: 'my search' must start with a letter or digit"):
        ProbesConfig(sts=["my search.jsonl"])
    with pytest.raises(SectionProblems, match=r"probes.cloze_texts: must be ≥ 0"):
        ProbesConfig(cloze_texts=-1)


def test_a_bad_probe_file_is_refused_at_load_naming_the_key_file_and_line(tmp_path, roberta_shards,
                                                                          bpe_tokenizer_dir):
    bad_pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"sentence_good": "a b c", "sentence_bad": "c b a"},
                                                       {"sentence_good": "a b c"}])
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "run",
                                                      probes={"minimal_pairs": [bad_pairs],
                                                              "retrieval": [str(tmp_path / "missing.jsonl")]})))
    with pytest.raises(ConfigError) as refused:
        load_pretrain_config(config, file_checks=[probe_problems])
    message = str(refused.value)
    assert f"probes.minimal_pairs: {bad_pairs}:2: 'sentence_bad' must be a non-empty string" in message
    assert "probes.retrieval: " in message and "missing.jsonl" in message
    assert not (tmp_path / "run").exists()
