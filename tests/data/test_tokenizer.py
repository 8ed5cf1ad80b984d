"""Tokenizer training: RoBERTa's and BERT's special tokens, AutoTokenizer loading, round trips."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from pipeline.common.errors import PipelineError
from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer, train_tokenizer


def test_bpe_tokenizer_loads_with_autotokenizer_and_frames_like_roberta(bpe_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    assert len(tok) == 400
    assert [tok.bos_token, tok.pad_token, tok.eos_token, tok.unk_token, tok.mask_token] == \
        ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    assert tok.convert_tokens_to_ids(["<s>", "<pad>", "</s>", "<unk>"]) == [0, 1, 2, 3]
    ids = tok("the encoder reads a shard")["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    pair = tok("the model", "a corpus")["input_ids"]
    assert pair.count(tok.eos_token_id) == 3  # <s> A </s></s> B </s>, as RoBERTa does


@pytest.mark.parametrize("text", ["the encoder reads a shard.", "Café naïve — 東京 😀 tabs\tand  spaces"])
def test_bpe_round_trips_any_text_byte_level(bpe_tokenizer_dir, text):
    tok = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text


def test_bpe_mask_token_absorbs_the_space_before_it(bpe_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    tokens = tok.convert_ids_to_tokens(tok("the <mask> model")["input_ids"])
    assert tokens[tokens.index("<mask>") - 1] != "Ġ"


def test_wordpiece_tokenizer_frames_like_bert_and_round_trips(wordpiece_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(wordpiece_tokenizer_dir)
    assert [tok.cls_token, tok.sep_token, tok.pad_token, tok.unk_token, tok.mask_token] == \
        ["[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"]
    enc = tok("The Model", "a corpus")
    assert enc["input_ids"][0] == tok.cls_token_id and enc["input_ids"].count(tok.sep_token_id) == 2
    assert set(enc["token_type_ids"]) == {0, 1}
    assert tok.decode(tok("The Encoder reads", add_special_tokens=False)["input_ids"]) == "the encoder reads"


def test_fingerprint_is_stable_across_loads_and_differs_between_tokenizers(bpe_tokenizer_dir,
                                                                          wordpiece_tokenizer_dir):
    a = describe_tokenizer(load_tokenizer(bpe_tokenizer_dir))
    b = describe_tokenizer(load_tokenizer(bpe_tokenizer_dir))
    c = describe_tokenizer(load_tokenizer(wordpiece_tokenizer_dir))
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert (a.cls_id, a.sep_id, a.pad_id, a.mask_id) == (0, 2, 1, 4)


def test_missing_tokenizer_folder_is_a_clear_error(tmp_path):
    with pytest.raises(PipelineError, match="no such folder"):
        load_tokenizer(tmp_path / "nope")


def test_tokenizer_without_mask_token_is_refused(tmp_path, documents):
    full = train_tokenizer(documents, "bpe", 300, tmp_path / "full", min_frequency=1)
    bare = PreTrainedTokenizerFast(tokenizer_object=full.backend_tokenizer, bos_token="<s>", eos_token="</s>")
    with pytest.raises(PipelineError, match="lacks the special tokens pad, mask"):
        describe_tokenizer(bare, "bare")


def test_train_tokenizer_cli_writes_a_loadable_folder(tmp_path, corpus_jsonl):
    from helpers import run_script

    out = tmp_path / "tok"
    proc = run_script("data_prep/train_tokenizer.py", "--input", corpus_jsonl, "--type", "wordpiece",
                      "--vocab-size", "250", "--min-frequency", "1", "--out", out, check=True)
    assert "vocabulary 250" in proc.stdout
    assert len(AutoTokenizer.from_pretrained(out)) == 250


def test_training_into_a_folder_with_other_files_is_refused_and_keeps_them(tmp_path, documents):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(PipelineError, match="holds other files and no tokenizer.json"):
        train_tokenizer(documents, "bpe", 300, tmp_path, min_frequency=1)
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    train_tokenizer(documents, "bpe", 300, tmp_path / "tok", min_frequency=1)
    train_tokenizer(documents, "bpe", 320, tmp_path / "tok", min_frequency=1)  # retraining replaces it
    assert len(AutoTokenizer.from_pretrained(tmp_path / "tok")) == 320
