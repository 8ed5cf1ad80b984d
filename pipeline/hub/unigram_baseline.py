"""The word-frequency baseline for minimal pairs: a unigram model of a corpus under the model's own tokenizer.

    unigram = UnigramModel.from_corpus(["corpus.jsonl"], encoder.tokenizer)
    unigram.score(["The cat is here.", "The cat are here."])

A sentence's score is the sum of log P(token) over its ordinary tokens (special tokens, as in
the pseudo-log-likelihood, are not scored), with add-one (Laplace) smoothing over the ordinary
vocabulary: P(t) = (count(t) + 1) / (N + V), N the corpus's ordinary tokens and V the number of
ordinary vocabulary entries; so a token the corpus never shows still has a finite cost. A model
that knows only this is what a masked-LM sits at on its unigram plateau: it can prefer a frequent
word to a rare one (is/are, a/an), and it cannot see word order (a swap scores the same: a tie).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from pipeline.common.errors import PipelineError

_CHUNK = 1000


class UnigramModel:
    """Add-one-smoothed token log-probabilities of a corpus; `score` sums them over a sentence's ordinary tokens."""

    def __init__(self, counts: np.ndarray, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.special = np.array(sorted(set(tokenizer.all_special_ids)), dtype=np.int64)
        counts = counts.astype(np.float64)
        ordinary = np.ones(len(counts), bool)
        ordinary[self.special[self.special < len(counts)]] = False
        self.tokens = int(counts[ordinary].sum())
        """N: the corpus's ordinary tokens."""
        vocabulary = int(ordinary.sum())
        self.log_probs = np.log((counts + 1.0) / (self.tokens + vocabulary))

    @classmethod
    def from_texts(cls, texts: Iterable[str], tokenizer) -> UnigramModel:
        """Token counts of `texts`, tokenized in chunks without special tokens."""
        counts = np.zeros(len(tokenizer), np.int64)
        chunk: list[str] = []
        for text in texts:
            chunk.append(text)
            if len(chunk) == _CHUNK:
                counts += cls._count(chunk, tokenizer, len(counts))
                chunk = []
        if chunk:
            counts += cls._count(chunk, tokenizer, len(counts))
        model = cls(counts, tokenizer)
        if model.tokens == 0:
            raise PipelineError("the unigram baseline's corpus has no text")
        return model

    @classmethod
    def from_corpus(cls, inputs: list[str], tokenizer, text_field: str = "text") -> UnigramModel:
        """Counts of a corpus as the shard stage reads it (.txt / .jsonl / .parquet, optionally .zst / .gz, folders)."""
        from pipeline.data.corpus import check_sources, iter_texts, resolve_inputs
        from pipeline.data.corpus_types import CorpusOptions

        sources, options = resolve_inputs(inputs), CorpusOptions(text_field=text_field)
        check_sources(sources, options)
        return cls.from_texts(iter_texts(sources, options), tokenizer)

    @staticmethod
    def _count(texts: list[str], tokenizer, size: int) -> np.ndarray:
        # verbose=False: counting whole documents is not feeding the model, so no "longer than the maximum" warning.
        ids = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
        flat = np.fromiter((t for row in ids for t in row), np.int64)
        return np.bincount(flat, minlength=size)[:size]

    def score(self, sentences: Sequence[str]) -> list[float]:
        """Sum of smoothed log unigram probabilities of each sentence's ordinary tokens (natural log)."""
        ids = self.tokenizer(list(sentences), add_special_tokens=False)["input_ids"]
        scores = []
        for row in ids:
            row = np.asarray(row, np.int64)
            row = row[~np.isin(row, self.special)]
            scores.append(float(self.log_probs[row].sum()))
        return scores
