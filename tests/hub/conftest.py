"""Tiny exports and a fine-tuning output for the hub-interface tests."""

from __future__ import annotations

import random

import pytest
from helpers import WORDS
from model_folders import save_export, save_finetune_output, save_span_output

RTE_LABELS = ("entailment", "not_entailment")


def sentence_pairs(n: int, seed: int = 0) -> list[tuple[tuple[str, str], str]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))).capitalize() + "."
        b = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))).capitalize() + "."
        rows.append(((a, b), RTE_LABELS[i % 2]))
    return rows


@pytest.fixture(scope="session")
def roberta_export(tmp_path_factory, bpe_tokenizer_dir):
    return save_export(bpe_tokenizer_dir, tmp_path_factory.mktemp("hub") / "roberta-export", "roberta")


@pytest.fixture(scope="session")
def bert_export(tmp_path_factory, wordpiece_tokenizer_dir):
    return save_export(wordpiece_tokenizer_dir, tmp_path_factory.mktemp("hub") / "bert-export", "bert")


@pytest.fixture(scope="session")
def rte_dev():
    return sentence_pairs(40, seed=3)


@pytest.fixture(scope="session")
def finetuned_rte(tmp_path_factory, bpe_tokenizer_dir, rte_dev):
    out = tmp_path_factory.mktemp("hub") / "rte-finetune"
    saved = save_finetune_output(bpe_tokenizer_dir, out, "rte", RTE_LABELS, rte_dev)
    return {"dir": out, **saved}


NER_TAGS = ("O", "B-LOC", "I-LOC", "B-NUM")


@pytest.fixture(scope="session")
def finetuned_ner(tmp_path_factory, bpe_tokenizer_dir):
    return save_span_output(bpe_tokenizer_dir, tmp_path_factory.mktemp("hub") / "ner-finetune", "ner", NER_TAGS)


@pytest.fixture(scope="session")
def finetuned_squad(tmp_path_factory, bpe_tokenizer_dir):
    return save_span_output(bpe_tokenizer_dir, tmp_path_factory.mktemp("hub") / "squad-finetune", "squad")


@pytest.fixture
def predict(capsys, monkeypatch):
    """`launchers/predict.py ARGS` in this process: (exit status, stdout, stderr). Each test launches the script
    once as a user would; its further calls come here, which saves a Python start-up and torch import each."""
    from pipeline.commands.predict import main

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # main sets it where unset; put back after the test

    def run(*args) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as stop:
            code = stop.code
        out, err = capsys.readouterr()
        return code, out, err

    return run
