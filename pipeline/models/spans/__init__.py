"""Span tasks in use: words to sub-token windows and back, question/context windows and answer decoding, the saved token
and QA models' predictors."""
