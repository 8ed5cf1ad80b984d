"""Cloze accuracy: top-1 fill-mask hits at masked positions of held-out text, through the hub interface."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pipeline.hub.cloze import cloze_accuracy, cloze_score, fill_mask_examples, masked_positions, validation_texts

CLS, SEP, PAD, MASK_ID = 0, 1, 2, 3
VOCAB = {"cat": 4, "dog": 5, "fish": 6}


class WordTokenizer:
    """Whitespace words → ids, framed by <s> … </s>; enough of a transformers tokenizer for the cloze."""

    all_special_ids = [CLS, SEP, PAD, MASK_ID]
    mask_token_id = MASK_ID

    def __call__(self, text, truncation=False, max_length=None):
        ids = [CLS, *(VOCAB[w] for w in text.split()), SEP]
        return {"input_ids": ids[:max_length] if truncation else ids}


class AlwaysGuesses(nn.Module):
    """An encoder whose top guess at every position is one fixed word, and which records what it was fed."""

    def __init__(self, word: str):
        super().__init__()
        self.tokenizer, self.max_positions, self.word = WordTokenizer(), 64, VOCAB[word]
        self.fed: list[torch.Tensor] = []

    def pad(self, rows):
        return nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=PAD)

    def extract_features(self, tokens):
        self.fed.append(tokens.clone())
        return torch.zeros(*tokens.shape, 4)

    def lm_head(self, features):
        logits = torch.zeros(*features.shape[:-1], 8)
        logits[..., self.word] = 1.0
        return logits


def test_a_model_that_always_guesses_cat_gets_two_of_three_blanks_in_cat_dog_cat():
    encoder = AlwaysGuesses("cat")
    assert cloze_accuracy(encoder, ["cat dog cat"], mask_rate=1.0) == pytest.approx(2 / 3)
    # Every ordinary token was blanked in one forward; <s> and </s> were left alone.
    assert encoder.fed[0].tolist() == [[CLS, MASK_ID, MASK_ID, MASK_ID, SEP]]


def test_scores_add_up_over_texts_and_max_texts_stops_reading():
    score = cloze_score(AlwaysGuesses("dog"), ["cat dog cat", "dog dog", "fish"], mask_rate=1.0)
    assert (score.correct, score.masked, score.texts) == (3, 6, 3)
    # The best constant guess (dog: 3 of the 6 blanks) is the plateau's share.
    assert score.constant_accuracy == pytest.approx(3 / 6)
    assert cloze_score(AlwaysGuesses("dog"), ["cat dog cat", "dog dog", "fish"], mask_rate=1.0, max_texts=1).masked == 3


def test_blanks_are_a_seeded_share_of_the_ordinary_tokens_and_never_special():
    ids = [CLS] + [4, 5, 6] * 10 + [SEP, PAD]
    special = {CLS, SEP, PAD, MASK_ID}
    first = masked_positions(ids, special, 0.15, np.random.default_rng([0, 0]))
    again = masked_positions(ids, special, 0.15, np.random.default_rng([0, 0]))
    assert first.tolist() == again.tolist() and len(first) == round(0.15 * 30)
    assert all(ids[p] not in special for p in first)
    # A tiny text still gets one blank; a text of only special tokens gets none.
    assert len(masked_positions([CLS, 4, SEP], special, 0.15, np.random.default_rng(0))) == 1
    assert len(masked_positions([CLS, SEP], special, 0.15, np.random.default_rng(0))) == 0


def test_a_real_export_is_scored_the_same_on_every_call_and_gives_fill_mask_examples(roberta_export, roberta_shards):
    from pipeline.hub.encoder import Encoder

    encoder = Encoder.from_pretrained(roberta_export)
    texts = validation_texts(roberta_shards, encoder.tokenizer)
    assert texts and all("<s>" not in t and "</s>" not in t for t in texts)
    first = cloze_score(encoder, texts, max_texts=8)
    assert first == cloze_score(encoder, texts, max_texts=8) and 0 <= first.accuracy <= 1 and first.masked >= 8
    examples = fill_mask_examples(encoder, texts, count=2, topk=3)
    assert len(examples) == 2
    for example in examples:
        assert example.masked_text.count("<mask>") == 1 and len(example.top) == 3
        assert example.masked_text.replace(" <mask>", example.answer) in "\n".join(texts)
