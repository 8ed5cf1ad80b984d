"""Token tagging data: readers, sub-token labels for BPE and WordPiece, windows, and seqeval metrics."""

from __future__ import annotations

import json

import pytest

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.token_files import check_known_tags, label_list, read_tagged
from pipeline.finetune.families.metrics import entity_metrics, token_accuracy
from pipeline.models.spans.token_windows import (
    IGNORE_INDEX,
    WordPieces,
    continuation_ids,
    encode_tagged,
    word_predictions,
)

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP I-ORG
rejects VBZ B-VP O
German JJ B-NP I-MISC
call NN I-NP O

Peter NNP B-NP I-PER
Blackburn NNP I-NP I-PER
"""

CONLLU = """# sent_id = 1
# text = I don't know.
1\tI\tI\tPRON\tPRP\t_\t3\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\tVBP\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
3.1\tknows\tknow\tVERB\tVBZ\t_\t_\t_\t_\t_
4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\t_
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

# sent_id = 2
1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_
"""


@pytest.fixture(params=["bpe", "wordpiece"])
def tokenizer(request, bpe_tokenizer_dir, wordpiece_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bpe_tokenizer_dir if request.param == "bpe" else wordpiece_tokenizer_dir)


def test_conll_skips_docstart_and_reads_iob1_as_iob2(tmp_path):
    path = tmp_path / "train.conll"
    path.write_text(CONLL)
    split = read_tagged(path)
    assert split.words == [["EU", "rejects", "German", "call"], ["Peter", "Blackburn"]]
    assert split.tags == [["B-ORG", "O", "B-MISC", "O"], ["B-PER", "I-PER"]]
    assert split.lines == [3, 8] and split.iob1_fixed == 3
    assert label_list(split) == ["O", "B-MISC", "B-ORG", "B-PER", "I-PER"]


def test_conllu_reads_upos_of_syntactic_words_only(tmp_path):
    path = tmp_path / "dev.conllu"
    path.write_text(CONLLU)
    split = read_tagged(path)
    assert split.words == [["I", "do", "n't", "know", "."], ["Hi"]]
    assert split.tags == [["PRON", "AUX", "PART", "VERB", "PUNCT"], ["INTJ"]]
    assert split.lines == [3, 12]


def test_compressed_files_read_the_same(tmp_path):
    import zstandard

    (tmp_path / "dev.conllu.zst").write_bytes(zstandard.ZstdCompressor().compress(CONLLU.encode()))
    assert read_tagged(tmp_path / "dev.conllu.zst").tags[1] == ["INTJ"]


def test_bad_files_name_the_file_and_line(tmp_path):
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text(json.dumps({"tokens": ["a", "b"], "tags": ["O", "O"]}) + "\n\n"
                     + json.dumps({"tokens": ["a", "b"], "tags": ["O"]}) + "\n")
    with pytest.raises(PipelineError, match=r"train.jsonl:3: 1 tags for 2 tokens"):
        read_tagged(jsonl)
    conll = tmp_path / "dev.txt"
    conll.write_text("EU B-ORG\nrejects\n")
    with pytest.raises(PipelineError, match=r"dev.txt:2: expected `WORD ... TAG`"):
        read_tagged(conll)
    conllu = tmp_path / "x.conllu"
    conllu.write_text("1\tHi\thi\n")
    with pytest.raises(PipelineError, match=r"x.conllu:1: .* 10 tab-separated columns, got 3"):
        read_tagged(conllu)


def test_an_unknown_dev_tag_is_an_error_or_read_as_o(tmp_path):
    (tmp_path / "dev.conll").write_text("Paris B-LOC\nis O\n\nBob B-PER\nsings B-SONG\n")
    train_labels = ["O", "B-LOC", "B-PER"]
    dev = read_tagged(tmp_path / "dev.conll")
    with pytest.raises(PipelineError, match=r"dev.conll:4: tag 'B-SONG' \(word 2, 'sings'\) never occurs in the train"
                                            r".*map_unknown_tags_to_o"):
        check_known_tags(dev, train_labels, map_unknown_to_o=False)
    check_known_tags(dev, train_labels, map_unknown_to_o=True)
    assert dev.tags[1] == ["B-PER", "O"] and dev.unknown_mapped == 1


def test_first_sub_token_is_labelled_and_matches_pretokenized_encoding(tokenizer):
    words = [["Quietly", "shardings", "tensor", "documented"], ["mountains", "gradient", "."]]
    labels = [[1, 2, 0, 1], [2, 2, 0]]
    windows = encode_tagged(tokenizer, words, labels, 64)
    prefix = WordPieces(tokenizer).prefix
    for s, sentence in enumerate(words):
        # The same ids and word alignment as the tokenizer's own pretokenized path with prefix spaces.
        reference = tokenizer([prefix + w for w in sentence], is_split_into_words=True)
        assert windows.input_ids[s] == reference["input_ids"]
        first = [i for i, w in enumerate(reference.word_ids()) if w is not None and w != reference.word_ids()[i - 1]]
        assert [p for p, w in enumerate(windows.word_at[s]) if w >= 0] == first
        assert [windows.labels[s][p] for p in first] == labels[s]
        assert sum(label != IGNORE_INDEX for label in windows.labels[s]) == len(sentence)
    assert len(windows.input_ids[0]) > len(words[0]) + 2, "the test needs words split into several sub-tokens"
    if prefix:  # byte-level BPE: every word reads as it does after a space in running text
        pieces = tokenizer.convert_ids_to_tokens(windows.input_ids[0])
        assert [pieces[p] for p, w in enumerate(windows.word_at[0]) if w >= 0][0].startswith("Ġ")


def test_label_all_tokens_labels_later_pieces_as_inside(tokenizer):
    labels = ["O", "B-PER", "I-PER"]
    windows = encode_tagged(tokenizer, [["shardings", "tensor"]], [[1, 0]], 64, label_all_tokens=True,
                            continuation=continuation_ids(labels))
    word_at, ids = windows.word_at[0], windows.labels[0]
    n_first = next(p for p in range(2, len(word_at)) if word_at[p] == 1) - 1  # pieces of "shardings"
    assert n_first > 1
    assert ids[1:1 + n_first] == [1] + [2] * (n_first - 1) and ids[0] == IGNORE_INDEX and ids[-1] == IGNORE_INDEX


def test_long_sentences_split_into_windows_that_label_every_word_once(tokenizer):
    import random

    rng = random.Random(0)
    vocab = "the river mountain quietly gradient tensor riverbanks Pretraining x , .".split()
    sentences = [[rng.choice(vocab) for _ in range(n)] for n in (3, 40, 95, 7, 60)]
    labels = [[rng.randrange(3) for _ in s] for s in sentences]
    windows = encode_tagged(tokenizer, sentences, labels, 24)
    assert max(map(len, windows.input_ids)) <= 24
    assert windows.split_sentences == 3 and windows.cut_words == 0
    seen = [(windows.sentence[k], w) for k in range(len(windows)) for w in windows.word_at[k] if w >= 0]
    assert sorted(seen) == [(s, w) for s, words in enumerate(sentences) for w in range(len(words))]
    # Reading each window's labels back at the first sub-tokens gives every sentence's labels.
    assert word_predictions(windows, windows.labels, [len(s) for s in sentences]) == labels
    assert "3 sentences longer than max_seq_len split" in windows.summary()


def test_a_word_with_no_sub_tokens_gets_unk_and_is_counted(wordpiece_tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(wordpiece_tokenizer_dir)
    windows = encode_tagged(tokenizer, [["river", "\u200b", "x"]], [[0, 1, 0]], 32)
    assert windows.empty_words == 1 and windows.input_ids[0][2] == tokenizer.unk_token_id
    assert [w for w in windows.word_at[0] if w >= 0] == [0, 1, 2]


def test_entity_metrics_equal_seqeval_and_a_hand_count():
    from seqeval.metrics import f1_score, precision_score, recall_score

    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "B-LOC", "I-LOC"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "O", "B-LOC", "O"]]
    metrics = entity_metrics(gold, pred)
    # By hand: 4 gold entities (PER, LOC, ORG, LOC), 3 predicted, 2 right (PER, ORG; "B-LOC" alone is a wrong span).
    assert metrics["precision"] == pytest.approx(2 / 3) and metrics["recall"] == pytest.approx(2 / 4)
    assert metrics["f1"] == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))
    assert (metrics["precision"], metrics["recall"], metrics["f1"]) == (
        precision_score(gold, pred), recall_score(gold, pred), f1_score(gold, pred))
    assert metrics["f1_PER"] == 1.0 and metrics["f1_ORG"] == 1.0 and metrics["f1_LOC"] == 0.0
    assert token_accuracy(gold, pred) == pytest.approx(6 / 8)
