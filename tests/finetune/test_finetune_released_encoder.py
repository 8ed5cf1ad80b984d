"""`launchers/finetune.py --model` on a released encoder saved without any head (MiniLM's layout, at test size)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from helpers import WORDS, run_script
from model_folders import save_headless_bert


def pair_examples(n: int, seed: int) -> list[dict]:
    """Sentence pairs: does the second sentence repeat the first one's opening word?"""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a = [rng.choice(WORDS) for _ in range(5)]
        b = [rng.choice(WORDS) for _ in range(5)]
        if i % 2:
            b[0] = a[0]
        rows.append({"a": " ".join(a), "b": " ".join(b), "label": "same" if i % 2 else "other"})
    return rows


@pytest.mark.slow  # one fine-tuning launch (~20 s)
def test_a_headless_bert_folder_fine_tunes_on_sentence_pairs_from_its_own_weights(tmp_path, wordpiece_tokenizer_dir):
    """At a negligible LR the saved encoder is the released one: its weights were loaded, not drawn afresh."""
    from transformers import AutoModelForSequenceClassification, BertModel

    released = save_headless_bert(wordpiece_tokenizer_dir, tmp_path / "released")
    for name, n, seed in (("train", 64, 0), ("dev", 32, 1)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pair_examples(n, seed)))
    config = {"task": "custom",
              "data": {"train_file": str(tmp_path / "train.jsonl"), "validation_file": str(tmp_path / "dev.jsonl"),
                       "text_fields": ["a", "b"], "label_field": "label", "max_seq_len": 32},
              "train": {"output_dir": str(tmp_path / "ft"), "learning_rate": 1e-12, "batch_size": 16, "epochs": 1},
              "tracking": {"enabled": False}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    proc = run_script("launchers/finetune.py", "--config", tmp_path / "config.json", "--model", released,
                      check=True)
    assert json.loads((tmp_path / "ft" / "metrics.json").read_text())["accuracy"] >= 0.0, proc.stdout
    saved = AutoModelForSequenceClassification.from_pretrained(tmp_path / "ft" / "seed_1" / "model")
    assert type(saved).__name__ == "BertForSequenceClassification"
    assert set(saved.config.id2label.values()) == {"other", "same"}
    start = BertModel.from_pretrained(released).state_dict()
    after = saved.bert.state_dict()
    assert start.keys() == after.keys()
    assert max((start[k].float() - after[k].float()).abs().max().item() for k in start) < 1e-6
    # The pair's second sentence is segment 1, as BERT was pretrained: the token type embeddings are used.
    assert saved.config.type_vocab_size == 2 and not torch.equal(*saved.bert.embeddings.token_type_embeddings.weight)
