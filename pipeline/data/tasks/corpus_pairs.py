"""Positive pairs mined from raw documents, with no labels: the `embed-corpus` task's data (docs/embeddings.md).

Three views, each switched on in `embedding.corpus.views`:

    crops          two independent random spans of one document (Contriever, Izacard et al. 2021): each a
                   fraction `crop_ratio` of the document's words, bounded by `crop_words`
    inverse_cloze  a sentence, and the passage around it with that sentence removed (Lee et al. 2019)
    title          a record's title (or a text document's Markdown heading) and its body (E5/GTE's weak pairs)

Mining is seeded per document (`seed` and the document's own text, not the path it was read from), so the same
corpus gives the same pairs whatever the other documents and wherever the checkout or the data lies, and every
training seed of a run trains on one fixed set of pairs. Documents too short for a view are skipped for it and
counted in one warning; a corpus where no view gives a pair is an error.
"""

from __future__ import annotations

import random
import re
import sys
from dataclasses import dataclass, field

from pipeline.common.config.tree import refuse
from pipeline.common.errors import PipelineError
from pipeline.data.tasks.corpus_documents import Document
from pipeline.data.tasks.splits import Split

VIEWS = ("crops", "inverse_cloze", "title")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\s*\n\s*")


@dataclass
class CorpusPairsConfig:
    """`embedding.corpus`: how `embed-corpus` reads its documents and which pairs it mines from them."""

    views: list[str] = field(default_factory=lambda: list(VIEWS))
    """Which pairs to mine: any of `crops`, `inverse_cloze`, `title`."""
    text_key: str = "text"
    """The key of a jsonl record (or the parquet column) holding the document's text."""
    title_key: str = "title"
    """The key of a jsonl record holding its title (records without it give no `title` pair)."""
    one_doc_per_line: bool = False
    """`.txt` inputs: each non-blank line is a document (default: documents are separated by blank lines)."""
    crop_ratio: list[float] = field(default_factory=lambda: [0.1, 0.5])
    """A crop's length as a fraction of its document's words, drawn uniformly in [low, high] (Contriever's)."""
    crop_words: list[int] = field(default_factory=lambda: [8, 64])
    """The fewest and most words of a crop (and of an inverse-cloze passage); a document needs twice the fewest
    to give two crops."""
    min_sentence_words: int = 4
    """Words an inverse-cloze sentence needs to be a query."""
    seed: int = 0
    """The mining seed: the same pairs for every training seed."""

    def __post_init__(self):
        problems, key = [], "embedding.corpus."
        unknown = [v for v in self.views if v not in VIEWS]
        if unknown or not self.views or len(set(self.views)) != len(self.views):
            problems.append(f"{key}views: expected one or more of {', '.join(VIEWS)} (each once), got {self.views}")
        if len(self.crop_ratio) != 2 or not 0 < self.crop_ratio[0] <= self.crop_ratio[1] <= 1:
            problems.append(f"{key}crop_ratio: expected [low, high] with 0 < low ≤ high ≤ 1, got {self.crop_ratio}")
        if len(self.crop_words) != 2 or not 1 <= self.crop_words[0] <= self.crop_words[1]:
            problems.append(f"{key}crop_words: expected [fewest, most] with 1 ≤ fewest ≤ most, got {self.crop_words}")
        if self.min_sentence_words < 1:
            problems.append(f"{key}min_sentence_words: must be ≥ 1, got {self.min_sentence_words}")
        for name in ("text_key", "title_key"):
            if not getattr(self, name):
                problems.append(f"{key}{name}: must name a key, got {getattr(self, name)!r}")
        refuse(self, problems)


@dataclass
class MinedPairs:
    """A split of (query, positive) pairs, with how many each view gave and how many documents it skipped."""

    split: Split
    documents: int
    made: dict[str, int]
    skipped: dict[str, int]


def mine_pairs(documents: list[Document], config: CorpusPairsConfig, source: str) -> MinedPairs:
    """Every switched-on view of every document, in document order; ids name the document and the view."""
    split = Split(f"{source} (mined: {', '.join(config.views)})")
    made, skipped = dict.fromkeys(config.views, 0), dict.fromkeys(config.views, 0)
    for document in documents:
        rng = random.Random(f"{config.seed}\0{document.title}\0{document.text}")
        for view in config.views:
            pair = MINERS[view](document, config, rng)
            if pair is None:
                skipped[view] += 1
                continue
            made[view] += 1
            split.texts.append(pair)
            split.ids.append(f"{document.where}#{view}")
    mined = MinedPairs(split, len(documents), made, skipped)
    _report(mined, config, source)
    return mined


def _crops(document: Document, config: CorpusPairsConfig, rng: random.Random) -> tuple[str, str] | None:
    words = document.text.split()
    fewest, most = config.crop_words
    if len(words) < 2 * fewest:
        return None
    spans = []
    for _ in range(2):
        length = round(rng.uniform(*config.crop_ratio) * len(words))
        length = max(fewest, min(length, most, len(words) - 1))
        spans.append((rng.randrange(len(words) - length + 1), length))
    if spans[0] == spans[1]:  # the same span twice teaches nothing: move the second by one word
        start, length = spans[1]
        spans[1] = (start + 1 if start + length < len(words) else start - 1, length)
    first, second = (" ".join(words[start:start + length]) for start, length in spans)
    return first, second


def _inverse_cloze(document: Document, config: CorpusPairsConfig, rng: random.Random) -> tuple[str, str] | None:
    sentences = [s.split() for s in SENTENCE_END.split(document.text.strip()) if s.strip()]
    fewest, most = config.crop_words
    candidates = [i for i, words in enumerate(sentences) if len(words) >= config.min_sentence_words
                  and sum(map(len, sentences)) - len(words) >= fewest]
    if len(sentences) < 2 or not candidates:
        return None
    chosen = rng.choice(candidates)
    before = [w for words in sentences[:chosen] for w in words]
    after = [w for words in sentences[chosen + 1:] for w in words]
    take_after = min(len(after), max(most // 2, most - len(before)))
    take_before = min(len(before), most - take_after)
    passage = before[len(before) - take_before:] + after[:take_after]
    return " ".join(sentences[chosen]), " ".join(passage)


def _title(document: Document, config: CorpusPairsConfig, rng: random.Random) -> tuple[str, str] | None:
    if document.title is None:
        return None
    return document.title, " ".join(document.text.split()[:config.crop_words[1]])


MINERS = {"crops": _crops, "inverse_cloze": _inverse_cloze, "title": _title}
REASONS = {"crops": "fewer than {two} words, twice embedding.corpus.crop_words' fewest",
           "inverse_cloze": "fewer than two sentences, or no sentence of embedding.corpus.min_sentence_words "
                            "words with {fewest} words around it",
           "title": "no title"}


def _report(mined: MinedPairs, config: CorpusPairsConfig, source: str) -> None:
    """One line of counts; a counted warning for skipped documents; an error when nothing was mined."""
    fewest = config.crop_words[0]
    skips = [f"{mined.skipped[view]} had {REASONS[view].format(two=2 * fewest, fewest=fewest)} ({view})"
             for view in config.views if mined.skipped[view]]
    made = ", ".join(f"{n} {view}" for view, n in mined.made.items())
    if not mined.split.texts:
        raise PipelineError(f"{source}: no pair could be mined from its {mined.documents} documents: "
                            f"{'; '.join(skips)}. Give longer documents, lower embedding.corpus.crop_words, or "
                            "switch on another view (embedding.corpus.views)")
    print(f"{source}: {len(mined.split)} pairs mined from {mined.documents} documents ({made})", file=sys.stderr,
          flush=True)
    if skips:
        print(f"warning: {source}: documents skipped by a view: {'; '.join(skips)}", file=sys.stderr, flush=True)
