"""Minimal pairs: does a masked-LM prefer the grammatical sentence of each pair? The share of pairs whose good
sentence has the higher pseudo-log-likelihood (`Encoder.score`), overall and per group.

    pairs = read_pairs("pairs.jsonl", group_by="phenomenon")
    scored = pair_scores(pairs, encoder.score)
    summarize(pairs, scored)   # {"overall": {"accuracy": 0.71, "pairs": 300, ...}, "groups": {...}}

The file holds JSON lines `{"sentence_good": ..., "sentence_bad": ..., ...}`, the format of the public
linguistic minimal-pair suites (BLiMP's lines carry `UID`, `linguistics_term`, `field`). A tie counts half
(chance). The `roberta-minimal-pairs` command and pretraining's in-loop probes both score through here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.errors import PipelineError

FIELDS = ("sentence_good", "sentence_bad")


@dataclass(frozen=True)
class Pair:
    good: str
    bad: str
    group: str | None
    """The value of the `--group-by` field, as text (None without grouping)."""


def read_pairs(path: str | Path, group_by: str | None = None) -> list[Pair]:
    """The pairs of a JSONL file; a line that is not an object with two non-empty sentences is an error naming it."""
    from pipeline.data.tasks.text_files import jsonl_records

    pairs = []
    for line, record in jsonl_records(path):
        where = f"{path}:{line}"
        if not isinstance(record, dict):
            raise PipelineError(f"{where}: expected a JSON object with {' and '.join(FIELDS)}, got "
                                f"{type(record).__name__}")
        for name in FIELDS:
            value = record.get(name)
            if not isinstance(value, str) or not value.strip():
                got = "no such field" if name not in record else f"{value!r}"[:60]
                raise PipelineError(f"{where}: {name!r} must be a non-empty string ({got}); a pair line is "
                                    '{"sentence_good": "...", "sentence_bad": "...", ...}')
        group = None
        if group_by is not None:
            if group_by not in record:
                raise PipelineError(f"{where}: no field {group_by!r} to group by (--group-by); this line has: "
                                    f"{', '.join(record)}")
            group = str(record[group_by])
        pairs.append(Pair(record["sentence_good"], record["sentence_bad"], group))
    if not pairs:
        raise PipelineError(f"{path}: no pairs in the file")
    return pairs


def pair_scores(pairs: Sequence[Pair], score) -> list[tuple[float, float]]:
    """(good, bad) scores of each pair from `score(sentences)`, each distinct sentence scored once."""
    sentences = list(dict.fromkeys(s for p in pairs for s in (p.good, p.bad)))
    by_sentence = dict(zip(sentences, score(sentences), strict=True))
    return [(by_sentence[p.good], by_sentence[p.bad]) for p in pairs]


def accuracy(scored: Sequence[tuple[float, float]]) -> dict:
    """Share of pairs where good > bad, a tie counting half; with the counts."""
    wins = sum(g > b for g, b in scored)
    ties = sum(g == b for g, b in scored)
    return {"accuracy": (wins + 0.5 * ties) / len(scored) if scored else float("nan"), "pairs": len(scored),
            "good_higher": wins, "ties": ties}


def summarize(pairs: Sequence[Pair], scored: Sequence[tuple[float, float]]) -> dict:
    """Overall accuracy and, where pairs have groups, the accuracy of each group (in sorted order)."""
    result = {"overall": accuracy(scored)}
    groups = sorted({p.group for p in pairs if p.group is not None})
    if groups:
        result["groups"] = {g: accuracy([s for p, s in zip(pairs, scored, strict=True) if p.group == g])
                            for g in groups}
    return result
