"""The word-start table: read once from the vocabulary, it finds the words the tokenizer itself saw."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import make_documents, tiny_pretrain_config

from pipeline.common.config.tree import ConfigError
from pipeline.common.errors import PipelineError
from pipeline.data.tokenizer import load_tokenizer
from pipeline.pretrain.config import MaskingConfig
from pipeline.pretrain.plan.masking import Masker, word_rule, word_start_table
from pipeline.pretrain.preflight import load_pretrain_config


def starts_from_table_and_from_tokenizer(tokenizer_dir, texts):
    """Word starts of each encoded text by the table (no re-tokenizing), and by the tokenizer's word ids."""
    tokenizer = load_tokenizer(str(tokenizer_dir))
    table = word_start_table(tokenizer, len(tokenizer))
    masker = Masker(len(tokenizer), tokenizer.mask_token_id, tuple(tokenizer.all_special_ids), 0, table,
                    masking=MaskingConfig(unit="word"))
    ours, theirs = [], []
    for text in texts:
        encoding = tokenizer(text)
        ids = np.array([encoding["input_ids"]])
        ours.append(masker.word_starts(ids)[0])
        words = encoding.word_ids()
        theirs.append(np.array([w is not None and (i == 0 or words[i - 1] != w) for i, w in enumerate(words)]))
    return ours, theirs


@pytest.mark.parametrize("fixture,rule", [("bpe_tokenizer_dir", ("space-marker", "Ġ")),
                                          ("wordpiece_tokenizer_dir", ("continuation-prefix", "##"))])
def test_table_starts_equal_the_tokenizers_word_boundaries(request, fixture, rule):
    tokenizer_dir = request.getfixturevalue(fixture)
    assert word_rule(load_tokenizer(str(tokenizer_dir))) == rule
    # Words and spaces only: both pre-tokenizers also split off punctuation and digits ("doc0"),
    # which the vocabulary rule, like fairseq's, keeps with the word before them.
    texts = [doc.split(" ", 1)[1].rstrip(".") for doc in make_documents(40, seed=3)]
    texts.append("pretrainingly quietlyriver tensormodel")  # unseen words, split into pieces
    ours, theirs = starts_from_table_and_from_tokenizer(tokenizer_dir, texts)
    for a, b in zip(ours, theirs, strict=True):
        assert a.tolist() == b.tolist()
    assert sum(len(a) - a.sum() for a in ours) > 20  # words split into several tokens were seen


def test_a_tokenizer_without_word_markers_is_refused_with_the_way_out(tmp_path, roberta_shards):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate([*specials, "a", "b"])}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    with pytest.raises(PipelineError, match="masking.unit=token"):
        word_start_table(tokenizer, 7)
    # The config check says so before any process starts.
    tokenizer.save_pretrained(tmp_path / "wordlevel")
    config = tiny_pretrain_config(roberta_shards, tmp_path / "wordlevel", tmp_path / "out", masking={"unit": "word"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="masking.unit word: tokenizer .* need word boundaries"):
        load_pretrain_config(tmp_path / "config.json")
