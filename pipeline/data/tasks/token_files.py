"""Token-tagging data: CoNLL NER files, CoNLL-U (UPOS) files and `{"tokens", "tags"}` JSONL.

Each reader returns sentences of words with one tag per word, and the line where each sentence
starts, so that every later problem can name it. `-DOCSTART-` lines, CoNLL-U comments, multiword
ranges (`19-20`) and empty nodes (`8.1`) are skipped. IOB1 NER tags are rewritten as IOB2 (an
`I-X` that opens an entity becomes `B-X`): that is how seqeval's default mode and conlleval read
IOB1, so scores are unchanged, and the model learns one tag for "an entity starts here".
Files may be zstd- or gzip-compressed (`.zst`, `.gz`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.catalog import TagFormat
from pipeline.data.tasks.text_files import jsonl_records, text_lines

OUTSIDE = "O"


@dataclass
class TaggedSplit:
    """Sentences of one file: words, their tags (strings), and the 1-based line each sentence starts on."""

    source: str
    words: list[list[str]] = field(default_factory=list)
    tags: list[list[str]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    iob1_fixed: int = 0
    """IOB1 `I-X` tags that opened an entity and were rewritten as `B-X`."""
    unknown_mapped: int = 0
    """Tags unseen in training that were read as `O` (with `map_unknown_tags_to_o`)."""

    def __len__(self) -> int:
        return len(self.words)

    def where(self, i: int) -> str:
        return f"{self.source}:{self.lines[i]}"


def format_of(path: str | Path) -> TagFormat:
    name = Path(path).name.lower().removesuffix(".zst").removesuffix(".gz")
    if name.endswith(".conllu"):
        return "conllu"
    if name.endswith(".jsonl"):
        return "jsonl"
    return "conll"


def read_tagged(path: str | Path, fmt: TagFormat | None = None, *, column: int | None = None) -> TaggedSplit:
    """Read a tagged file; `fmt` defaults to the file name (`.conllu`, `.jsonl`, else CoNLL)."""
    fmt = fmt or format_of(path)
    readers = {"conll": read_conll, "conllu": read_conllu, "jsonl": read_tag_jsonl}
    split = readers[fmt](path) if column is None else readers[fmt](path, column=column)
    if not split.words:
        raise PipelineError(f"{path}: no sentences (the file is empty)")
    return split


def read_conll(path: str | Path, column: int = -1) -> TaggedSplit:
    """CoNLL-2003 style: `WORD ... TAG` per line (tag in `column`), blank lines between sentences."""
    split = TaggedSplit(str(path))
    words: list[str] = []
    tags: list[str] = []
    start = 0
    for number, line in text_lines(path):
        parts = line.split()
        if not parts:
            _close(split, words, tags, start)
            words, tags = [], []
            continue
        if parts[0] == "-DOCSTART-":
            continue
        if len(parts) < 2:
            raise PipelineError(f"{path}:{number}: expected `WORD ... TAG` (2 or more columns), got {line!r}: "
                                "the sentence has a token without a tag")
        if not words:
            start = number
        words.append(parts[0])
        tags.append(parts[column])
    _close(split, words, tags, start)
    split.iob1_fixed = sum(to_iob2(t) for t in split.tags)
    return split


def read_conllu(path: str | Path, column: int = 3) -> TaggedSplit:
    """CoNLL-U: the word (column 2) and UPOS (column 4) of each syntactic word.

    Multiword tokens (`19-20 don't`) are skipped: their parts (`do`, `n't`) carry the tags.
    Empty nodes (`8.1`) of enhanced dependencies are not words of the sentence either.
    """
    split = TaggedSplit(str(path))
    words: list[str] = []
    tags: list[str] = []
    start = 0
    for number, line in text_lines(path):
        if not line.strip():
            _close(split, words, tags, start)
            words, tags = [], []
            continue
        if line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 10:
            raise PipelineError(f"{path}:{number}: a CoNLL-U token line has 10 tab-separated columns, got "
                                f"{len(parts)}: {line[:80]!r}")
        if "-" in parts[0] or "." in parts[0]:
            continue
        if not words:
            start = number
        words.append(parts[1])
        tags.append(parts[column])
    _close(split, words, tags, start)
    return split


def read_tag_jsonl(path: str | Path) -> TaggedSplit:
    """One `{"tokens": [...], "tags": [...]}` object per line."""
    split = TaggedSplit(str(path))
    for number, record in jsonl_records(path):
        if not isinstance(record, dict) or not {"tokens", "tags"} <= record.keys():
            found = ", ".join(sorted(record)) if isinstance(record, dict) else type(record).__name__
            raise PipelineError(f"{path}:{number}: expected an object with \"tokens\" and \"tags\" lists, "
                                f"got {found}")
        words, tags = record["tokens"], record["tags"]
        if not isinstance(words, list) or not isinstance(tags, list):
            raise PipelineError(f"{path}:{number}: \"tokens\" and \"tags\" must be lists")
        if len(words) != len(tags):
            raise PipelineError(f"{path}:{number}: {len(tags)} tags for {len(words)} tokens; each token needs "
                                "exactly one tag")
        if not words:
            continue
        split.words.append([str(w) for w in words])
        split.tags.append([str(t) for t in tags])
        split.lines.append(number)
    return split


def _close(split: TaggedSplit, words: list[str], tags: list[str], start: int) -> None:
    if words:
        split.words.append(words)
        split.tags.append(tags)
        split.lines.append(start)


def to_iob2(tags: list[str]) -> int:
    """Rewrite IOB1 tags in place as IOB2; return how many changed (0 for IOB2 or non-IOB tags)."""
    changed = 0
    previous = OUTSIDE
    for i, tag in enumerate(tags):
        if tag.startswith("I-") and previous[2:] != tag[2:]:
            tags[i] = "B-" + tag[2:]
            changed += 1
        previous = tags[i] if tags[i][:2] in ("B-", "I-") else OUTSIDE
    return changed


def is_iob(labels: list[str]) -> bool:
    """True when every label is `O`, `B-X` or `I-X`: entity-level metrics apply."""
    return bool(labels) and all(t == OUTSIDE or (t[:2] in ("B-", "I-") and len(t) > 2) for t in labels)


def label_list(train: TaggedSplit) -> list[str]:
    """The train file's tags, sorted (`O` first when present): class id order."""
    tags = {t for sentence in train.tags for t in sentence}
    return sorted(tags, key=lambda t: (t != OUTSIDE, t[2:] if t[:2] in ("B-", "I-") else t, t))


def check_known_tags(split: TaggedSplit, labels: list[str], *, map_unknown_to_o: bool) -> None:
    """Every tag of `split` must be one of `labels`; else an error naming the line (or `O`, if asked)."""
    known = set(labels)
    for i, sentence in enumerate(split.tags):
        for j, tag in enumerate(sentence):
            if tag in known:
                continue
            if map_unknown_to_o and OUTSIDE in known:
                sentence[j] = OUTSIDE
                split.unknown_mapped += 1
                continue
            hint = ("set data.map_unknown_tags_to_o=true to read such tags as O" if OUTSIDE in known
                    else "the train file has no O tag to map it to")
            raise PipelineError(f"{split.where(i)}: tag {tag!r} (word {j + 1}, {split.words[i][j]!r}) never occurs "
                                f"in the train file ({len(labels)} tags: {', '.join(labels[:20])}"
                                f"{', …' if len(labels) > 20 else ''}); {hint}")
