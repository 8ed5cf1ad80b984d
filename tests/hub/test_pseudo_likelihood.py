"""Pseudo-log-likelihood scoring: each token masked in turn, its log-probability summed, special tokens never scored."""

from __future__ import annotations

import pytest
import torch
from model_folders import save_headless_bert

from pipeline.common.errors import PipelineError
from pipeline.hub.encoder import Encoder
from pipeline.hub.pseudo_likelihood import scored_positions

SENTENCES = ["the model reads a document.", "a model the reads document.", "seven orange rivers",
             "the encoder is quiet and the batch is seven tokens long."]


def naive_pll(encoder: Encoder, sentence: str) -> float:
    """The definition, one forward per token: mask position i alone, add log P(true token at i)."""
    ids = encoder.tokenizer(sentence)["input_ids"]
    special = set(encoder.tokenizer.all_special_ids)
    total = 0.0
    for i, token in enumerate(ids):
        if token in special:
            continue
        masked = torch.tensor(ids)
        masked[i] = encoder.tokenizer.mask_token_id
        with torch.no_grad():
            logits = encoder.lm_head(encoder.extract_features(masked)[0, i])
        total += float(logits.log_softmax(-1)[token])
    return total


@pytest.mark.parametrize("architecture", ["roberta", "bert", "modernbert"])
def test_batched_pll_equals_the_one_mask_at_a_time_loop(architecture, tmp_path, bpe_tokenizer_dir,
                                                         wordpiece_tokenizer_dir):
    from model_folders import save_export

    tokenizer = wordpiece_tokenizer_dir if architecture == "bert" else bpe_tokenizer_dir
    encoder = Encoder.from_pretrained(save_export(tokenizer, tmp_path / architecture, architecture))
    expected = [naive_pll(encoder, s) for s in SENTENCES]
    # A small batch bound splits one sentence's masked copies over several forwards: the sums must not change.
    for batch_tokens in (7, 64, 100_000):
        assert encoder.score(SENTENCES, batch_tokens=batch_tokens) == pytest.approx(expected, abs=1e-4)
    assert all(score < 0 for score in expected)


def test_special_tokens_are_never_masked_nor_scored(roberta_export):
    encoder = Encoder.from_pretrained(roberta_export)
    tokenizer = encoder.tokenizer
    ids = tokenizer("the model reads.")["input_ids"]
    special = set(tokenizer.all_special_ids)
    assert ids[0] in special and ids[-1] in special
    assert scored_positions(ids, special) == list(range(1, len(ids) - 1))

    fed = []
    original = encoder.extract_features
    encoder.extract_features = lambda tokens: fed.append(tokens.clone()) or original(tokens)
    encoder.score(["the model reads."])
    rows = torch.cat(fed)
    assert len(rows) == len(ids) - 2  # one masked copy per ordinary token
    assert (rows[:, 0] == ids[0]).all() and (rows[:, -1] == ids[-1]).all()  # <s> and </s> never masked
    # An empty sentence has only special tokens: nothing to score, a score of 0.
    assert encoder.score([""]) == [0.0]


def test_a_sentence_longer_than_the_model_is_an_error_not_a_truncated_score(roberta_export):
    encoder = Encoder.from_pretrained(roberta_export)
    with pytest.raises(PipelineError, match="sentence 1 is .* tokens, more than the model's"):
        encoder.score(["short.", "the model " * 80])


def test_a_model_without_an_mlm_head_is_refused_by_name(tmp_path, wordpiece_tokenizer_dir, finetuned_rte):
    headless = save_headless_bert(wordpiece_tokenizer_dir, tmp_path / "minilm-like")
    with pytest.raises(PipelineError, match=f"model {headless}: pseudo-log-likelihood scoring needs a masked-LM "
                                            "head.*without a trained MLM head"):
        Encoder.from_pretrained(headless).score(["a sentence."])
    classifier = finetuned_rte["dir"]
    with pytest.raises(PipelineError, match="pseudo-log-likelihood scoring needs a masked-LM head.*fine-tuned model"):
        Encoder.from_pretrained(classifier).score(["a sentence."])


def test_bf16_scores_stay_close_to_fp32_and_an_unknown_precision_is_refused(roberta_export):
    encoder = Encoder.from_pretrained(roberta_export)
    exact = encoder.score(SENTENCES)
    assert encoder.score(SENTENCES, precision="bf16") == pytest.approx(exact, abs=0.1)
    with pytest.raises(PipelineError, match="precision must be 'fp32' or 'bf16'"):
        encoder.score(SENTENCES, precision="fp16")
