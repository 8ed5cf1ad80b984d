"""The hub interface on ModernBERT exports and fine-tuning outputs: what holds for RoBERTa holds here."""

from __future__ import annotations

import pytest
import torch
from conftest import NER_TAGS, RTE_LABELS
from model_folders import save_export, save_finetune_output, save_span_output

from pipeline.hub import Encoder


@pytest.fixture(scope="module")
def modernbert_export(tmp_path_factory, bpe_tokenizer_dir):
    return save_export(bpe_tokenizer_dir, tmp_path_factory.mktemp("hub") / "modernbert-export", "modernbert")


@pytest.fixture(scope="module")
def modernbert(modernbert_export):
    return Encoder.from_pretrained(modernbert_export)


def test_the_export_loads_with_the_auto_classes(modernbert_export):
    from transformers import AutoModel, AutoModelForMaskedLM

    assert type(AutoModelForMaskedLM.from_pretrained(modernbert_export)).__name__ == "ModernBertForMaskedLM"
    assert type(AutoModel.from_pretrained(modernbert_export)).__name__ == "ModernBertModel"


def test_encode_features_and_fill_mask(modernbert):
    tokens = modernbert.encode("The river is quiet.", "A model reads the corpus.")
    assert tokens.tolist() == modernbert.tokenizer("The river is quiet.", "A model reads the corpus.")["input_ids"]
    assert modernbert.decode(tokens) == ["The river is quiet.", "A model reads the corpus."]
    features = modernbert.extract_features(tokens)
    hiddens = modernbert.extract_features(tokens, return_all_hiddens=True)
    assert features.shape == (1, len(tokens), 64) and len(hiddens) == 3 and torch.equal(hiddens[-1], features)
    results = modernbert.fill_mask("The river is <mask> quiet.", topk=len(modernbert.tokenizer))
    probabilities = [p for _, p, _ in results]
    assert probabilities == sorted(probabilities, reverse=True) and abs(sum(probabilities) - 1) < 1e-4
    assert all(f.startswith("The river is") and f.endswith(" quiet.") for f, _, _ in results[:5])


def test_fill_mask_equals_the_masked_lm_models_own_logits(modernbert, modernbert_export):
    from transformers import AutoModelForMaskedLM

    hf = AutoModelForMaskedLM.from_pretrained(modernbert_export).eval()
    tokens = modernbert.encode("The river is <mask> quiet.".replace("<mask>", modernbert.tokenizer.mask_token))
    with torch.no_grad():
        expected = hf(input_ids=tokens[None]).logits
        ours = modernbert.lm_head(modernbert.extract_features(tokens))
    assert torch.allclose(ours, expected, atol=1e-5)


def test_a_registered_head_predicts_the_same_padded_or_alone(modernbert):
    modernbert.register_classification_head("toy", num_classes=3)
    batch = modernbert.pad([modernbert.encode("the river"), modernbert.encode("a model reads the corpus", "seven")])
    log_probs = modernbert.predict("toy", batch)
    assert log_probs.shape == (2, 3) and torch.allclose(log_probs.exp().sum(-1), torch.ones(2), atol=1e-5)
    assert torch.allclose(modernbert.predict("toy", modernbert.encode("the river"))[0], log_probs[0], atol=1e-5)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_sentence_output_predicts_what_the_hf_model_predicts(tmp_path, bpe_tokenizer_dir, rte_dev, pooling):
    # With `mean` pooling a padded batch must average only the real tokens: classify() pads, predict() does not.
    from transformers import AutoModelForSequenceClassification

    saved = save_finetune_output(bpe_tokenizer_dir, tmp_path / "ft", "rte", RTE_LABELS, rte_dev,
                                 architecture="modernbert", classifier_pooling=pooling)
    enc = Encoder.from_pretrained(tmp_path / "ft")
    hf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "ft" / "seed_1" / "model").eval()
    (a, b), _ = rte_dev[0]
    with torch.no_grad():
        expected = hf(**enc.tokenizer(a, b, return_tensors="pt")).logits.log_softmax(-1)
    assert torch.allclose(enc.predict("rte", enc.encode(a, b)), expected, atol=1e-5)
    short, long = enc.encode("the river"), enc.encode(a, b)
    padded = enc.predict("rte", enc.pad([short, long]))
    assert torch.allclose(padded[0], enc.predict("rte", short)[0], atol=1e-5)  # the padding is not averaged in
    assert enc.classify("rte", [pair for pair, _ in rte_dev], batch_size=7) == saved["predictions"]


def test_token_and_qa_outputs_tag_words_and_answer(tmp_path, bpe_tokenizer_dir):
    from pipeline.models.spans.predictors import QuestionAnswerer, WordTagger

    ner = save_span_output(bpe_tokenizer_dir, tmp_path / "ner", "ner", NER_TAGS, architecture="modernbert")
    squad = save_span_output(bpe_tokenizer_dir, tmp_path / "squad", "squad", architecture="modernbert")
    words = ("the river mountain is seven " * 9).split()  # 45 words: several 32-token windows
    tags = Encoder.from_pretrained(ner).predict("ner", words)
    assert len(tags) == len(words) and set(tags) <= set(NER_TAGS)
    assert tags == WordTagger(ner).predict(words)
    question, context = "what runs past the mountain?", "the river runs past the mountain seven times " * 5
    answer = Encoder.from_pretrained(squad).answer(question, context)
    assert answer and answer in context and answer == QuestionAnswerer(squad).answer(question, context)
