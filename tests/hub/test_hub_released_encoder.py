"""A released encoder without an MLM head (MiniLM's layout, at test size) through the hub interface."""

from __future__ import annotations

import pytest
import torch
from model_folders import save_headless_bert

from pipeline.common.errors import PipelineError
from pipeline.hub import Encoder


@pytest.fixture(scope="module")
def released(tmp_path_factory, wordpiece_tokenizer_dir):
    return save_headless_bert(wordpiece_tokenizer_dir, tmp_path_factory.mktemp("hub") / "released")


def test_features_are_the_released_models_own(released):
    from transformers import AutoTokenizer, BertModel

    encoder = Encoder.from_pretrained(released)
    tokens = encoder.encode("the river is quiet .", "a model reads the corpus .")
    expected = AutoTokenizer.from_pretrained(released)("the river is quiet .", "a model reads the corpus .",
                                                       return_tensors="pt")
    assert tokens.tolist() == expected["input_ids"][0].tolist()
    reference = BertModel.from_pretrained(released).eval()
    with torch.no_grad():
        theirs = reference(**expected).last_hidden_state
    assert torch.allclose(encoder.extract_features(tokens), theirs, atol=1e-5)


def test_a_registered_head_predicts_log_probabilities(released):
    encoder = Encoder.from_pretrained(released)
    encoder.register_classification_head("sentiment", 2, labels=("negative", "positive"))
    logp = encoder.predict("sentiment", encoder.encode("a quiet river ."))
    assert logp.shape == (1, 2) and torch.allclose(logp.exp().sum(-1), torch.ones(1))


def test_fill_mask_without_a_trained_mlm_head_is_a_clear_error_not_random_words(released):
    encoder = Encoder.from_pretrained(released)
    assert encoder.lm_head is None
    with pytest.raises(PipelineError, match="without a trained MLM head.*model.init_from"):
        encoder.fill_mask("the river is <mask> .")


def test_cloze_on_a_model_without_a_trained_mlm_head_is_the_same_clear_error(released):
    from pipeline.hub.cloze import cloze_score

    with pytest.raises(PipelineError, match="cloze needs a masked-LM head.*without a trained MLM head"):
        cloze_score(Encoder.from_pretrained(released), ["the river is wide ."])


def test_a_masked_lm_folder_missing_its_head_weights_is_treated_as_headless(tmp_path, released):
    """A BertForMaskedLM config whose head transformers would have to initialise: no head, not noise."""
    import json
    import shutil

    folder = tmp_path / "mlm-without-head"
    shutil.copytree(released, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLM"]}))
    encoder = Encoder.from_pretrained(folder)
    with pytest.raises(PipelineError, match="BertForMaskedLM weights without a trained MLM head"):
        encoder.fill_mask("the river is <mask> .")
