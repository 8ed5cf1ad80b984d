"""Hard negatives mined for the training pairs that have none (`embedding.hard_negatives`), from the training split
alone: its positives and given negatives are the candidates.

- `bm25`: the query's best lexical matches (bm25s; sentence-transformers has no lexical miner);
- `model`: its nearest neighbours under the model about to be trained (sentence-transformers'
  `mine_hard_negatives`, with the configured prompts).

Both rank the candidates without the query's own positives (every positive any line gives it) and drop those within
`relative_margin` of the positive's score; here each list then loses its near-duplicates of a positive or of the
query (the same words up to case and spacing), skips `range_min` and keeps `count`. A pair with its own negative
keeps it and is not mined; a pair short of `count` candidates stays a plain pair, counted.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from pipeline.data.tasks.splits import Split
from pipeline.finetune.families.embedding.options import HardNegatives, Prompts

SPARE = 8
"""Candidates asked for beyond `range_min + count`, so that dropping near-duplicates still leaves `count`."""


def same_text(text: str) -> str:
    """The text as a duplicate check compares it: its words, case folded."""
    return " ".join(text.split()).casefold()


@dataclass(frozen=True)
class MinedSplit:
    """The training split with mined negatives, and what mining did."""

    split: Split
    miner: str
    mined: int
    """Pairs given `count` mined negatives."""
    own: int
    """Pairs that had their own negative (kept, not mined)."""
    short: int
    """Pairs for which fewer than `count` candidates were left (trained as plain pairs)."""

    def record(self) -> dict:
        return {"miner": self.miner, "mined": self.mined, "own_negative": self.own, "too_few_candidates": self.short}

    def summary(self) -> str:
        return (f"{self.split.source}: hard negatives ({self.miner}) mined for {self.mined} pairs; {self.own} kept "
                f"their own negative; {self.short} had too few candidates and stay plain pairs")


def mine_negatives(split: Split, settings: HardNegatives, *, model=None, prompts: Prompts | None = None,
                   batch_size: int = 32) -> MinedSplit:
    """`split` with `settings.negatives` mined negatives after each pair's positive (`model`: the miner for `model`)."""
    pending = [i for i, texts in enumerate(split.texts) if len(texts) == 2]
    positives: dict[str, set[str]] = {}
    for texts in split.texts:
        positives.setdefault(texts[0], set()).add(texts[1])
    queries = list(dict.fromkeys(split.texts[i][0] for i in pending))
    corpus = list(dict.fromkeys(t for texts in split.texts for t in texts[1:]))
    depth = settings.skipped + settings.negatives + SPARE
    if not queries:
        ranked = {}
    elif settings.miner == "bm25":
        ranked = bm25_ranked(queries, corpus, positives, depth, settings.relative_margin)
    else:
        ranked = model_ranked(model, queries, corpus, positives, depth, settings.relative_margin, prompts or Prompts(),
                              batch_size)
    chosen = {q: kept_candidates(q, ranked.get(q, []), positives[q], settings) for q in queries}
    out = Split(split.source, list(split.texts), split.labels, split.ids)
    short = 0
    for i in pending:
        query, positive = split.texts[i]
        if len(chosen[query]) == settings.negatives:
            out.texts[i] = (query, positive, *chosen[query])
        else:
            short += 1
    mined = MinedSplit(out, settings.miner, len(pending) - short, len(split) - len(pending), short)
    print(mined.summary(), file=sys.stderr, flush=True)
    return mined


def kept_candidates(query: str, ranked: list[str], positives: set[str], settings: HardNegatives) -> list[str]:
    """`ranked` without near-duplicates of a positive or of the query, past `range_min`, the first `count`."""
    taken = {same_text(p) for p in positives} | {same_text(query)}
    kept = []
    for text in ranked:
        if same_text(text) not in taken:
            taken.add(same_text(text))
            kept.append(text)
    return kept[settings.skipped:settings.skipped + settings.negatives]


def bm25_ranked(queries: list[str], corpus: list[str], positives: dict[str, set[str]], depth: int,
                relative_margin: float | None) -> dict[str, list[str]]:
    """Each query's best BM25 matches (Lucene's BM25, English stop words, as the evaluator's baseline), its positives
    and the candidates within `relative_margin` of its weakest positive's score left out; no shared word, no match."""
    from pipeline.hub.embedding_evaluation import Bm25

    where = {text: i for i, text in enumerate(corpus)}
    ranked = {}
    for query, scores in zip(queries, Bm25(corpus).scores(queries), strict=True):
        own = [where[p] for p in positives[query]]
        positive = float(scores[own].min())
        scores[own] = 0.0
        if relative_margin is not None:
            scores[scores > positive - abs(positive) * relative_margin] = 0.0
        top = np.argsort(-scores, kind="stable")[:depth]
        ranked[query] = [corpus[d] for d in top if scores[d] > 0]
    return ranked


def model_ranked(model, queries: list[str], corpus: list[str], positives: dict[str, set[str]], depth: int,
                 relative_margin: float | None, prompts: Prompts, batch_size: int) -> dict[str, list[str]]:
    """Each query's nearest candidates by cosine under `model` (sentence-transformers' `mine_hard_negatives`: the
    query's positives excluded, `relative_margin` applied), best first."""
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    rows = [(q, p) for q in queries for p in sorted(positives[q])]
    found = mine_hard_negatives(Dataset.from_dict({"anchor": [q for q, _ in rows], "positive": [p for _, p in rows]}),
                                model, corpus=corpus, num_negatives=min(depth, len(corpus)),
                                relative_margin=relative_margin, sampling_strategy="top", output_format="labeled-list",
                                query_prompt=prompts.query, corpus_prompt=prompts.document, batch_size=batch_size,
                                verbose=False)
    return {row["anchor"]: row["positive"][1:] for row in found}
