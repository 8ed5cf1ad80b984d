"""`model.init_from`: continue pretraining from an HF folder (an export of ours) or a hub name.

The weights are checked against the tokenizer and the shards when the config loads, before any
process group or weight loading, with one error naming both numbers of every mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import PYTHON, ROOT, tiny_pretrain_config

from pipeline.common.config.tree import ConfigError
from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
from pipeline.models.architectures.config import ModelConfig
from pipeline.models.architectures.hf_model import EXPORT_CLASSES, hf_config
from pipeline.pretrain.preflight import load_pretrain_config

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}


def save_hf_folder(out: Path, tokenizer_dir: Path, seq_len: int, architecture: str = "roberta") -> Path:
    """An HF model folder laid out like `launchers/export.py` writes it."""
    tokenizer = load_tokenizer(tokenizer_dir)
    torch.manual_seed(0)
    model = EXPORT_CLASSES[architecture](hf_config(ModelConfig(architecture=architecture, **TINY),
                                                   describe_tokenizer(tokenizer), seq_len))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def config_file(tmp_path, shards, tokenizer, **model) -> Path:
    data = tiny_pretrain_config(shards, tokenizer, tmp_path / "out", model={**TINY, **model})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def test_an_export_with_the_same_tokenizer_and_enough_positions_is_accepted(tmp_path, roberta_shards,
                                                                           bpe_tokenizer_dir):
    export = save_hf_folder(tmp_path / "export", bpe_tokenizer_dir, seq_len=64)
    config = load_pretrain_config(config_file(tmp_path, roberta_shards, bpe_tokenizer_dir, init_from=str(export)))
    assert config.model.init_from == str(export)


def test_too_few_position_embeddings_for_the_shards_is_one_clear_error(tmp_path, roberta_shards,
                                                                       bpe_tokenizer_dir):
    export = save_hf_folder(tmp_path / "export", bpe_tokenizer_dir, seq_len=32)
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(config_file(tmp_path, roberta_shards, bpe_tokenizer_dir, init_from=str(export)))
    pad = describe_tokenizer(load_tokenizer(bpe_tokenizer_dir)).pad_id
    assert f"has {32 + pad + 1} position embeddings, the shards' seq_len 64 needs {64 + pad + 1}" in str(err.value)


def test_weights_trained_with_another_vocabulary_are_refused_naming_both_sizes(tmp_path, roberta_shards,
                                                                               bpe_tokenizer_dir,
                                                                               wordpiece_tokenizer_dir):
    export = save_hf_folder(tmp_path / "export", wordpiece_tokenizer_dir, seq_len=64)  # a RoBERTa on another vocab
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(config_file(tmp_path, roberta_shards, bpe_tokenizer_dir, init_from=str(export)))
    wp, bpe = len(load_tokenizer(wordpiece_tokenizer_dir)), len(load_tokenizer(bpe_tokenizer_dir))
    assert f"its vocabulary has {wp} tokens, data.tokenizer {bpe_tokenizer_dir} has {bpe}" in str(err.value)


def test_a_bert_folder_cannot_continue_as_roberta(tmp_path, roberta_shards, bpe_tokenizer_dir):
    export = save_hf_folder(tmp_path / "export", bpe_tokenizer_dir, seq_len=64, architecture="bert")
    with pytest.raises(ConfigError, match="holds a 'bert' model, model.architecture is 'roberta'"):
        load_pretrain_config(config_file(tmp_path, roberta_shards, bpe_tokenizer_dir, init_from=str(export)))


def test_a_missing_folder_or_unreachable_hub_name_is_reported_up_front(tmp_path, roberta_shards,
                                                                       bpe_tokenizer_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="model.init_from ./nowhere: no such folder"):
        load_pretrain_config(config_file(tmp_path, roberta_shards, bpe_tokenizer_dir, init_from="./nowhere"))
    with pytest.raises(ConfigError, match="model.init_from FacebookAI/roberta-base: cannot read its config.json"):
        load_pretrain_config(config_file(tmp_path, roberta_shards, bpe_tokenizer_dir,
                                         init_from="FacebookAI/roberta-base"))


@pytest.mark.slow
def test_training_continues_from_the_exported_weights(tmp_path, roberta_shards, bpe_tokenizer_dir):
    """One step at a negligible LR: the new export still holds the starting weights."""
    import subprocess

    from transformers import AutoModelForMaskedLM

    start = save_hf_folder(tmp_path / "start", bpe_tokenizer_dir, seq_len=64)
    data = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "run",
                                model={**TINY, "init_from": str(start), "hidden_dropout_prob": 0.0},
                                optimizer={"lr": 1e-12, "weight_decay": 0.0}, schedule={"warmup_steps": 0},
                                train={"max_steps": 1, "eval_sequences": 16})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    proc = subprocess.run([PYTHON, str(ROOT / "launchers/pretrain.py"), "--config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = AutoModelForMaskedLM.from_pretrained(start).state_dict()
    after = AutoModelForMaskedLM.from_pretrained(tmp_path / "run" / "export").state_dict()
    assert before.keys() == after.keys()
    assert max((before[k].float() - after[k].float()).abs().max().item() for k in before) < 1e-6
