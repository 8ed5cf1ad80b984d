"""The embedding section's training options, each off by default: hard-negative mining, query and document prompts
(Matryoshka dimensions are a plain list in `config.EmbeddingConfig`). Like `config.py`, it imports nothing of the
fine-tuning package."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.common.config.tree import refuse

MAX_MINED = 64
"""Negatives mined per pair at most (sentence-transformers recommends 10 or fewer)."""


@dataclass
class HardNegatives:
    """`embed-pairs`: a mined hard negative for each training pair that has none (a pair with its own keeps it)."""

    miner: Literal["bm25", "model"] | None = None
    """`bm25`: the query's best lexical matches (bm25s); `model`: its nearest neighbours under the model being
    trained, before any step (sentence-transformers' `mine_hard_negatives`); None: no mining."""
    count: int | None = None
    """Negatives mined per pair; None: 1. (The defaults are null so that a run finished before these keys existed
    still matches its recipe.)"""
    range_min: int | None = None
    """Skip this many of the best-ranked candidates (after the positives): the nearest are often unlabelled
    positives. None: 0."""
    relative_margin: float | None = None
    """Skip a candidate scoring above the positive's score less this fraction of it (NV-Retriever's 0.05)."""

    @property
    def negatives(self) -> int:
        return 1 if self.count is None else self.count

    @property
    def skipped(self) -> int:
        return self.range_min or 0

    def __post_init__(self):
        problems = []
        if not 1 <= self.negatives <= MAX_MINED:
            problems.append(f"embedding.hard_negatives.count: must be in [1, {MAX_MINED}], got {self.count}")
        if self.skipped < 0:
            problems.append(f"embedding.hard_negatives.range_min: must be ≥ 0, got {self.range_min}")
        if self.relative_margin is not None and not 0 <= self.relative_margin < 1:
            problems.append(f"embedding.hard_negatives.relative_margin: must be in [0, 1) (or null), "
                            f"got {self.relative_margin}")
        refuse(self, problems)


@dataclass
class Prompts:
    """Text put before each query and each document, in training, evaluation and the saved folder (its
    `config_sentence_transformers.json`, so `model.encode(texts, prompt_name="query")` applies it)."""

    query: str | None = None
    document: str | None = None

    @property
    def named(self) -> dict[str, str]:
        """The prompts by sentence-transformers' names (`query`, `document`); unset ones left out."""
        return {name: text for name, text in (("query", self.query), ("document", self.document)) if text}

    def columns(self, names) -> dict[str, str]:
        """The trainer's prompt per dataset column: the anchor is the query, the positive and negatives documents."""
        role = {name: self.query if name == "anchor" else self.document for name in names}
        return {name: text for name, text in role.items() if text}


def task_problems(embedding, task: str) -> list[str]:
    """The options a task cannot take: mining needs pairs, prompts an asymmetric search."""
    problems = []
    if embedding.hard_negatives.miner is not None and task != "embed-pairs":
        problems.append(f"embedding.hard_negatives: mines negatives for embed-pairs only, not {task}")
    if embedding.prompts.named and task == "embed-sts":
        problems.append("embedding.prompts: STS pairs are symmetric (no query, no document); unset it for embed-sts")
    return problems
