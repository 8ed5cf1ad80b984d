"""Words with tags → sub-token model inputs, in windows of at most `max_seq_len` tokens.

The first sub-token of each word carries the word's label; the others get the ignore index
(-100), or, with `label_all_tokens`, the label too (a `B-X` word's later pieces get `I-X`, as a
later piece never starts an entity). A sentence longer than `max_seq_len` is split at word
boundaries into windows; every word lands in exactly one window, so every word is labelled and
predicted exactly once. Sentences split, words longer than a whole window (their first pieces are
kept) and words the tokenizer turns into nothing (given `unk`) are counted, never silent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pipeline.models.heads import IGNORE_INDEX


def is_byte_level(tokenizer) -> bool:
    """True for byte-level BPE (RoBERTa, GPT-2): a word needs its leading space to read as it does in text."""
    def walk(node) -> bool:
        if isinstance(node, dict):
            return node.get("type") == "ByteLevel" or any(walk(v) for v in node.values())
        if isinstance(node, list):
            return any(walk(v) for v in node)
        return False

    return walk(json.loads(tokenizer.backend_tokenizer.to_str()).get("pre_tokenizer"))


def special_frame(tokenizer) -> tuple[list[int], list[int]]:
    """The special ids before and after one sequence (`<s>` … `</s>`, `[CLS]` … `[SEP]`), from the tokenizer itself."""
    enc = tokenizer("a")
    ids, words = enc["input_ids"], enc.word_ids()
    first = words.index(0)
    last = len(words) - 1 - words[::-1].index(0)
    return ids[:first], ids[last + 1:]


class WordPieces:
    """Sub-token ids of single words, each distinct word tokenized once.

    Tokenizing each word on its own, with a leading space for byte-level BPE, gives the same
    pieces as `tokenizer(words, is_split_into_words=True)` with `add_prefix_space=True` (that is
    what pretokenized input does inside `tokenizers`), but works for tokenizers that refuse
    pretokenized input, and the cache makes it several times faster on real corpora where
    words repeat.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prefix = " " if is_byte_level(tokenizer) else ""
        self.cache: dict[str, list[int]] = {}
        self.empty_words = 0
        """Word occurrences that tokenized to nothing (e.g. a lone zero-width space) and were given `unk`."""

    def __call__(self, sentences: list[list[str]]) -> list[list[list[int]]]:
        new = sorted({w for words in sentences for w in words} - self.cache.keys())
        if new:
            encoded = self.tokenizer([self.prefix + w for w in new], add_special_tokens=False)["input_ids"]
            self.cache.update(zip(new, encoded, strict=True))
        out = []
        for words in sentences:
            pieces = []
            for w in words:
                ids = self.cache[w]
                if not ids:
                    ids = [self.tokenizer.unk_token_id]
                    self.empty_words += 1
                pieces.append(ids)
            out.append(pieces)
        return out


@dataclass
class TokenWindows:
    """Model inputs for tagged sentences, one or more windows per sentence."""

    input_ids: list[list[int]] = field(default_factory=list)
    labels: list[list[int]] = field(default_factory=list)
    """Label id per token; IGNORE_INDEX for special tokens (and later sub-tokens, unless all are labelled)."""
    word_at: list[list[int]] = field(default_factory=list)
    """The word index (within its sentence) at each word's first sub-token; -1 at every other token."""
    sentence: list[int] = field(default_factory=list)
    """The sentence each window comes from."""
    split_sentences: int = 0
    """Sentences longer than one window, split into several."""
    cut_words: int = 0
    """Words with more sub-tokens than a whole window holds; their first sub-tokens are kept."""
    empty_words: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)

    def summary(self) -> str:
        return (f"{len(self)} windows of {len(set(self.sentence))} sentences; {self.split_sentences} sentences longer "
                f"than max_seq_len split into windows; {self.cut_words} over-long words cut to a window; "
                f"{self.empty_words} words with no sub-tokens given unk")


def continuation_ids(labels: list[str]) -> list[int]:
    """For each label id, the id a word's later sub-tokens get with `label_all_tokens` (B-X → I-X when known)."""
    index = {label: i for i, label in enumerate(labels)}
    return [index.get("I-" + label[2:], i) if label.startswith("B-") else i for i, label in enumerate(labels)]


def encode_tagged(tokenizer, sentences: list[list[str]], label_ids: list[list[int]] | None, max_seq_len: int,
                  *, label_all_tokens: bool = False, continuation: list[int] | None = None,
                  pieces: WordPieces | None = None) -> TokenWindows:
    """Tokenize word sequences into windows; `label_ids` is None for unlabelled input (prediction)."""
    pieces = pieces or WordPieces(tokenizer)
    before, after = special_frame(tokenizer)
    budget = max_seq_len - len(before) - len(after)
    if budget < 1:
        raise ValueError(f"max_seq_len {max_seq_len} leaves no room for words after the special tokens")
    empty_before = pieces.empty_words
    out = TokenWindows()
    for s, word_pieces in enumerate(pieces(sentences)):
        window: list[int] = []  # word indices
        used = 0
        windows = []
        for w, ids in enumerate(word_pieces):
            if len(ids) > budget:
                out.cut_words += 1
                word_pieces[w] = ids = ids[:budget]
            if window and used + len(ids) > budget:
                windows.append(window)
                window, used = [], 0
            window.append(w)
            used += len(ids)
        windows.append(window)
        out.split_sentences += len(windows) > 1
        for window in windows:
            ids, labels, word_at = list(before), [IGNORE_INDEX] * len(before), [-1] * len(before)
            for w in window:
                n = len(word_pieces[w])
                ids += word_pieces[w]
                word_at += [w] + [-1] * (n - 1)
                if label_ids is None:
                    labels += [IGNORE_INDEX] * n
                else:
                    label = label_ids[s][w]
                    rest = (continuation[label] if continuation else label) if label_all_tokens else IGNORE_INDEX
                    labels += [label] + [rest] * (n - 1)
            ids += after
            labels += [IGNORE_INDEX] * len(after)
            word_at += [-1] * len(after)
            out.input_ids.append(ids)
            out.labels.append(labels)
            out.word_at.append(word_at)
            out.sentence.append(s)
    out.empty_words = pieces.empty_words - empty_before
    return out


def word_predictions(windows: TokenWindows, token_predictions: list[list[int]], sentence_lengths: list[int]
                     ) -> list[list[int]]:
    """Per-token predictions of each window → one prediction per word (read at the word's first sub-token)."""
    result = [[-1] * n for n in sentence_lengths]
    for k, predicted in enumerate(token_predictions):
        row = result[windows.sentence[k]]
        for position, w in enumerate(windows.word_at[k]):
            if w >= 0:
                row[w] = int(predicted[position])
    missing = [(s, row.index(-1)) for s, row in enumerate(result) if -1 in row]
    if missing:
        raise RuntimeError(f"{len(missing)} words got no prediction (first: sentence {missing[0][0]}, "
                           f"word {missing[0][1]}); windows and sentences are out of step")
    return result
