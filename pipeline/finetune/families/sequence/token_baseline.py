"""The token-count baseline: what a task gives to a model that knows no order and no pretraining.

A bag of words (scikit-learn's `CountVectorizer`, every word and punctuation token, lower case)
into a logistic regression (a ridge regression for a regression task), fitted on the task's
training split and scored on its dev splits with the task's own metrics. A sentence pair is one bag
plus how much its two sentences share (the cosine of their count vectors and the Jaccard overlap of
their words), which a linear model on one bag cannot compute and which decides much of a similarity
or paraphrase task. Printed beside the neural arms, it shows when a task needs no pretraining: a
keyword task is solved by counting, a word-order task (`bigram_shift.py`) is not.
"""

from __future__ import annotations

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.splits import Split, TaskData
from pipeline.finetune.families.metrics import task_metrics

TOKEN_PATTERN = r"(?u)\b\w+\b|[^\w\s]"
"""Every word, one letter long too, and every punctuation mark (scikit-learn's default drops both)."""


def _documents(split: Split) -> list[str]:
    # A sentence pair is one bag: the baseline knows no order, not even which sentence a word is in.
    return [" ".join(texts) for texts in split.texts]


def _overlap(split: Split, analyze) -> list[list[float]]:
    """Per pair: the cosine of the two sentences' token counts and the Jaccard overlap of their token sets."""
    from collections import Counter

    rows = []
    for first, second in split.texts:
        a, b = Counter(analyze(first)), Counter(analyze(second))
        dot = sum(count * b[token] for token, count in a.items())
        norms = (sum(c * c for c in a.values()) * sum(c * c for c in b.values())) ** 0.5
        union = len(a.keys() | b.keys())
        rows.append([dot / norms if norms else 0.0, len(a.keys() & b.keys()) / union if union else 0.0])
    return rows


def token_count_baseline(data: TaskData, *, seed: int = 0) -> dict[str, float]:
    """The task's metrics on its dev splits (MNLI's `_matched` / `_mismatched` as the neural runs report them)."""
    import numpy as np
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression, Ridge

    if not isinstance(data.train, Split) or data.train.labels is None:
        raise PipelineError(f"task {data.spec.name!r}: the token-count baseline scores sentence and sentence-pair "
                            "tasks (GLUE, custom), not token tagging or QA")
    from scipy.sparse import csr_matrix, hstack

    vectorizer = CountVectorizer(lowercase=True, token_pattern=TOKEN_PATTERN)
    vectorizer.fit(_documents(data.train))
    pairs = bool(data.train.texts) and len(data.train.texts[0]) == 2

    def featurize(split: Split):
        bag = vectorizer.transform(_documents(split))
        return hstack([bag, csr_matrix(_overlap(split, vectorizer.build_analyzer()))]).tocsr() if pairs else bag

    features = featurize(data.train)
    labels = np.asarray(data.train.labels)
    if data.spec.is_regression:
        model = Ridge(alpha=1.0)
    else:
        if len(set(labels.tolist())) < 2:
            raise PipelineError(f"{data.train.source}: one class only; the baseline needs two or more")
        model = LogisticRegression(max_iter=2000, random_state=seed)
    model.fit(features, labels if data.spec.is_regression else labels.astype(int))
    predictions = {name: model.predict(featurize(split)) for name, split in data.dev.items()}
    golds = {name: np.asarray(split.labels) for name, split in data.dev.items()}
    return task_metrics(data.spec.metrics, predictions, golds)
