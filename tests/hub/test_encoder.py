"""The hub interface behaves like fairseq's RoBERTa hub: framing, features, fill_mask, heads, predict."""

from __future__ import annotations

import pytest
import torch

from pipeline.common.errors import PipelineError
from pipeline.hub import Encoder


@pytest.fixture(scope="module")
def roberta(roberta_export):
    return Encoder.from_pretrained(roberta_export)


@pytest.fixture(scope="module")
def bert(bert_export):
    return Encoder.from_pretrained(bert_export)


def test_roberta_pair_framing_equals_the_tokenizers_own(roberta):
    tok = roberta.tokenizer
    tokens = roberta.encode("The river is quiet.", "A model reads the corpus.")
    assert tokens.dtype == torch.long and tokens.dim() == 1
    assert tokens.tolist() == tok("The river is quiet.", "A model reads the corpus.")["input_ids"]
    a = tok("The river is quiet.", add_special_tokens=False)["input_ids"]
    b = tok("A model reads the corpus.", add_special_tokens=False)["input_ids"]
    s, e = tok.convert_tokens_to_ids(["<s>", "</s>"])
    assert tokens.tolist() == [s, *a, e, e, *b, e]  # <s> a </s></s> b </s>
    c = tok("Seven.", add_special_tokens=False)["input_ids"]
    three = roberta.encode("The river is quiet.", "A model reads the corpus.", "Seven.")
    assert three.tolist() == [s, *a, e, e, *b, e, e, *c, e]
    assert roberta.encode("The river is quiet.", "A model reads the corpus.", no_separator=True).tolist() == \
        [s, *a, e, *b, e]


def test_bert_pair_framing_and_segment_ids_equal_the_tokenizers_own(bert):
    expected = bert.tokenizer("the river is quiet .", "a model reads the corpus .")
    tokens = bert.encode("the river is quiet .", "a model reads the corpus .")
    assert tokens.tolist() == expected["input_ids"]
    assert bert.tokenizer.convert_ids_to_tokens(tokens.tolist())[0] == "[CLS]"
    assert bert.segment_ids(tokens).tolist() == expected["token_type_ids"]
    assert 1 in expected["token_type_ids"]


def test_encode_decode_round_trip(roberta, bert):
    assert roberta.decode(roberta.encode("Hello river, seven tensors!")) == "Hello river, seven tensors!"
    assert roberta.decode(roberta.encode("The mask.", "A batch.", "Seven.")) == ["The mask.", "A batch.", "Seven."]
    assert bert.decode(bert.encode("the river", "a model")) == ["the river", "a model"]


def test_feature_shapes_and_all_hiddens_end_with_the_default(roberta, bert):
    for enc in (roberta, bert):
        tokens = enc.encode("the river is quiet", "a model")
        features = enc.extract_features(tokens)
        assert features.shape == (1, len(tokens), 64)
        hiddens = enc.extract_features(tokens, return_all_hiddens=True)
        assert len(hiddens) == enc.model.config.num_hidden_layers + 1
        assert all(h.shape == features.shape for h in hiddens)
        assert torch.equal(hiddens[-1], features)


def test_too_long_input_is_a_clear_error(roberta):
    tokens = roberta.encode(" ".join(["river"] * 200))
    with pytest.raises(PipelineError, match="maximum length"):
        roberta.extract_features(tokens)
    assert len(roberta.encode(" ".join(["river"] * 200), max_length=64)) == 64


def test_fill_mask_sorted_probabilities_and_exactly_one_mask(roberta, bert):
    for enc in (roberta, bert):
        results = enc.fill_mask("The river is <mask> quiet.", topk=4)
        assert len(results) == 4
        probs = [p for _, p, _ in results]
        assert probs == sorted(probs, reverse=True) and all(0 < p <= 1 for p in probs)
        for filled, _, token in results:
            assert filled.startswith("The river is") and filled.endswith(" quiet.") and token.strip() in filled
        for bad in ("No mask here.", "Two <mask> and <mask>."):
            with pytest.raises(PipelineError, match="exactly one <mask>"):
                enc.fill_mask(bad)


def test_fill_mask_gives_the_masked_word_its_leading_space(roberta):
    """Byte-level BPE: `is <mask>` must predict the space-prefixed token, as in fairseq."""
    tok = roberta.tokenizer
    space_words = [i for t, i in tok.get_vocab().items() if t.startswith("Ġ") and len(t) > 2]
    results = roberta.fill_mask("The river is <mask>", topk=len(tok))
    word = tok.decode([space_words[0]])
    assert word.startswith(" ") and f"The river is{word}" in [f for f, _, _ in results]
    assert abs(sum(p for _, p, _ in results) - 1) < 1e-4  # the whole vocabulary's probabilities


def test_predict_log_probabilities_sum_to_one_in_a_padded_batch(roberta):
    roberta.register_classification_head("toy", num_classes=3)
    batch = roberta.pad([roberta.encode("the river"), roberta.encode("a model reads the corpus", "seven")])
    log_probs = roberta.predict("toy", batch)
    assert log_probs.shape == (2, 3)
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(2), atol=1e-5)
    logits = roberta.predict("toy", batch, return_logits=True)
    assert torch.allclose(logits.log_softmax(-1), log_probs)
    # Padding does not change a sentence's prediction.
    alone = roberta.predict("toy", roberta.encode("the river"))
    assert torch.allclose(alone[0], log_probs[0], atol=1e-5)
    with pytest.raises(PipelineError, match="no classification head 'mnli'"):
        roberta.predict("mnli", batch)


def test_train_eval_and_device(roberta):
    roberta.register_classification_head("toy", num_classes=2)
    roberta.train()
    assert roberta.model.training and roberta.classification_heads["toy"].training
    roberta.eval()
    assert not roberta.model.training
    assert roberta.to("cpu").device == torch.device("cpu")


def test_a_finetuned_run_loaded_by_task_name_reproduces_its_saved_dev_accuracy(finetuned_rte, rte_dev):
    import json

    enc = Encoder.from_pretrained(finetuned_rte["dir"])
    assert list(enc.classification_heads) == ["rte"] and enc.labels("rte") == ("entailment", "not_entailment")
    predicted = [enc.labels("rte")[enc.predict("rte", enc.encode(a, b)).argmax().item()] for (a, b), _ in rte_dev]
    saved = [line.split("\t")[1] for line in
             (finetuned_rte["dir"] / "seed_1" / "dev_predictions.tsv").read_text().splitlines()[1:]]
    assert predicted == saved
    accuracy = sum(p == label for p, (_, label) in zip(predicted, rte_dev, strict=True)) / len(rte_dev)
    assert accuracy == json.loads((finetuned_rte["dir"] / "metrics.json").read_text())["accuracy"]
    assert enc.classify("rte", [pair for pair, _ in rte_dev], batch_size=7) == saved
    with pytest.raises(PipelineError, match="no masked-LM head"):
        enc.fill_mask("The <mask> is here.")


def test_bert_finetuned_head_predicts_what_the_hf_model_predicts(tmp_path, wordpiece_tokenizer_dir, rte_dev):
    from model_folders import save_finetune_output
    from transformers import AutoModelForSequenceClassification

    save_finetune_output(wordpiece_tokenizer_dir, tmp_path / "ft", "rte", ("entailment", "not_entailment"), rte_dev,
                         architecture="bert")
    enc = Encoder.from_pretrained(tmp_path / "ft")
    hf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "ft" / "seed_1" / "model").eval()
    (a, b), _ = rte_dev[0]
    inputs = enc.tokenizer(a, b, return_tensors="pt")
    with torch.no_grad():
        expected = hf(**inputs).logits.log_softmax(-1)
        assert torch.allclose(enc.predict("rte", enc.encode(a, b)), expected, atol=1e-6)


def test_unusable_paths_are_clear_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PipelineError, match="not an HF model folder"):
        Encoder.from_pretrained(tmp_path / "empty")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "best_model.json").write_text('{"seed": 1, "path": "seed_1/model"}')
    with pytest.raises(PipelineError, match="holds no saved model"):
        Encoder.from_pretrained(tmp_path / "broken")
    with pytest.raises(PipelineError, match="no such folder"):
        Encoder.from_pretrained(tmp_path / "missing" / "model")
