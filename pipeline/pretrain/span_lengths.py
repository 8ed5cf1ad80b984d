"""SpanBERT's span lengths: the truncated geometric distribution of a span's words, its mean, and the share of
words spans of that length can cover (the masker draws from it; the `masking` section checks a rate against it)."""

from __future__ import annotations

import numpy as np


def span_length_distribution(p: float, max_words: int) -> np.ndarray:
    """P(length = 1 … max_words): geometric(p) truncated at `max_words` and renormalised, as SpanBERT does."""
    weights = p * (1 - p) ** np.arange(max_words)
    return weights / weights.sum()


def mean_span_words(p: float, max_words: int) -> float:
    """The mean span length in words of `span_length_distribution(p, max_words)`."""
    return float(span_length_distribution(p, max_words) @ np.arange(1, max_words + 1))


def span_coverage_problem(key: str, probability: float, p: float, max_words: int) -> str | None:
    """Why spans of this length cannot cover `probability` (the value of `key`) of the words, or None.

    Spans are separated by at least one word, so spans of m words on average cover at most m / (m + 1).
    """
    mean = mean_span_words(p, max_words)
    most = mean / (mean + 1)
    if probability <= most:
        return None
    return (f"{key} {probability} is more than spans of {mean:.2f} words on average "
            f"(masking.span_p {p}, masking.span_max_words {max_words}) can cover with a word "
            f"between them ({most:.3f}); lower it or lengthen the spans")
