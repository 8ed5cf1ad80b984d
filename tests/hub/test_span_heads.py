"""Token-tagging and QA fine-tuning outputs through the hub: the fine-tuning predictors' results, clear errors."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import NER_TAGS
from helpers import WORDS, run_script
from model_folders import save_span_output

from pipeline.common.errors import PipelineError
from pipeline.hub import Encoder
from pipeline.models.spans.predictors import QuestionAnswerer, WordTagger


def sentence(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(WORDS) for _ in range(n)]


@pytest.fixture(scope="module")
def ner(finetuned_ner):
    return Encoder.from_pretrained(finetuned_ner)


@pytest.fixture(scope="module")
def squad(finetuned_squad):
    return Encoder.from_pretrained(finetuned_squad)


def test_a_token_output_predicts_one_tag_per_word_as_the_word_tagger_does(ner, finetuned_ner):
    tagger = WordTagger(finetuned_ner)
    assert ner.span_predictors.keys() == {"ner"} and ner.labels("ner") == NER_TAGS
    for n, seed in ((1, 0), (7, 1), (45, 2)):  # 45 words: several windows of 32 tokens
        words = sentence(n, seed)
        tags = ner.predict("ner", words)
        assert len(tags) == n and set(tags) <= set(NER_TAGS)
        assert tags == tagger.predict(words)
        assert ner.predict("ner", "  ".join(words)) == tags  # a text is split on whitespace
    assert len(set(ner.predict("ner", sentence(45, 2)))) > 1  # an untrained head still varies: not a constant


def test_a_bert_token_output_tags_words_too(tmp_path, wordpiece_tokenizer_dir):
    out = save_span_output(wordpiece_tokenizer_dir, tmp_path / "pos", "pos", ("NOUN", "VERB", "DET"), "bert")
    words = sentence(12, 5)
    assert Encoder.from_pretrained(out).predict("pos", words) == WordTagger(out).predict(words)


def test_a_qa_output_answers_as_the_question_answerer_does(squad, finetuned_squad):
    answerer = QuestionAnswerer(finetuned_squad)
    assert squad.span_predictors.keys() == {"squad"}
    for seed in range(3):
        question = " ".join(sentence(4, 10 + seed)) + "?"
        context = " ".join(sentence(40, 20 + seed)) + "."  # longer than a 32-token window: several windows
        answer = squad.answer(question, context)
        assert answer == answerer.answer(question, context) == squad.answer(question, context, head="squad")
        assert answer and answer in context


def test_features_come_from_the_fine_tuned_models_own_encoder(ner, squad, finetuned_ner):
    tokens = ner.encode("the river is quiet")
    tagger = WordTagger(finetuned_ner)
    with torch.no_grad():
        expected = tagger.model.base_model(input_ids=tokens[None]).last_hidden_state
    assert torch.allclose(ner.extract_features(tokens), expected, atol=1e-6)
    assert ner.model is ner.span_predictors["ner"].model.base_model
    assert squad.extract_features(squad.encode("a model")).shape == (1, len(squad.encode("a model")), 64)


def test_wrong_calls_on_span_heads_are_clear_errors(ner, squad, finetuned_rte):
    with pytest.raises(PipelineError, match="no question-answering head .*heads: ner.*squad / qa-custom"):
        ner.answer("Who?", "The river.")
    with pytest.raises(PipelineError, match="'squad' answers questions: use answer"):
        squad.predict("squad", "the river")
    with pytest.raises(PipelineError, match="'ner' is a token-classification head.*predict\\(head, words\\)"):
        ner.classify("ner", ["the river"])
    with pytest.raises(PipelineError, match="no classification head 'rte' \\(this model has: ner\\)"):
        ner.predict("rte", ner.encode("the river"))
    with pytest.raises(PipelineError, match="list of words or a text"):
        ner.predict("ner", ner.encode("the river"))
    with pytest.raises(PipelineError, match="no words to tag"):
        ner.predict("ner", "   ")
    with pytest.raises(PipelineError, match="the context is empty"):
        squad.answer("Who?", " ")
    with pytest.raises(PipelineError, match="no masked-LM head"):
        ner.fill_mask("The <mask> river.")
    rte = Encoder.from_pretrained(finetuned_rte["dir"])
    with pytest.raises(PipelineError, match="'rte' classifies token tensors.*classify"):
        rte.predict("rte", "a text")
    with pytest.raises(PipelineError, match="no question-answering head \\(this model.s heads: rte\\)"):
        rte.answer("Who?", "The river.")


@pytest.mark.slow  # a launch of the script
def test_predict_cli_tags_words_and_answers(finetuned_ner, finetuned_squad, predict):
    words = sentence(9, 3)
    proc = run_script("launchers/predict.py", "--model", finetuned_ner, "--task", "ner", " ".join(words), check=True)
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert rows == [[w, t] for w, t in zip(words, WordTagger(finetuned_ner).predict(words), strict=True)]

    question, context = "Where is the river?", " ".join(sentence(30, 4)) + "."
    expected = QuestionAnswerer(finetuned_squad).answer(question, context)
    code, out, _ = predict("--model", finetuned_squad, "--task", "squad", "--question", question, "--context", context)
    assert code == 0 and out.rstrip("\n") == expected
    code, out, _ = predict("--model", finetuned_squad, "--task", "squad", question, context)
    assert code == 0 and out.rstrip("\n") == expected
    code, _, err = predict("--model", finetuned_squad, "--task", "squad", question)
    assert code == 2 and "give a question and a context" in err and "Traceback" not in err
