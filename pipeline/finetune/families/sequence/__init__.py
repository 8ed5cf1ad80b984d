"""Sentence and sentence-pair classification and regression: the family, its confusion figure, the token-count
baseline."""
