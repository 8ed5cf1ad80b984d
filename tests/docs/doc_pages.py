"""Reading the documentation pages: fenced blocks, prose, headings, links and the commands they show.

Used by test_docs_drift.py; pure text handling, no project imports.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
RUNNERS = {"python", "python3", "deepspeed", "torchrun", "accelerate", "bash", "sh"}
SCRIPT_DIRS = {"launchers", "data_prep", "benchmarks", "docs"}
COMMAND_ENDS = {"&&", "||", ";", "|", ">", ">>", "2>&1"}
PLACEHOLDER_TOKENS = re.compile(r"(?<![A-Za-z])(PLACEHOLDER|TODO|TBD|XXX|FIXME)(?![A-Za-z])")


def pages() -> list[Path]:
    """Every page a user reads: the README, docs/*.md, and the READMEs of configs/ and pipeline/."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             ROOT / "configs" / "README.md", ROOT / "pipeline" / "README.md"]
    return [p for p in found if p.is_file()]


@dataclass
class Block:
    language: str
    text: str
    line: int  # the first line of the block's content, 1-based


def split_page(text: str) -> tuple[list[Block], str]:
    """(fenced blocks, prose): the prose keeps its line count, with every fenced line blanked."""
    blocks, prose, fence, body, start = [], [], None, [], 0
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if fence is None and stripped.startswith("```"):
            fence, body, start = stripped[3:].strip().lower(), [], number + 1
            prose.append("")
        elif fence is not None and stripped.startswith("```"):
            blocks.append(Block(fence, "\n".join(body), start))
            fence = None
            prose.append("")
        elif fence is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    return blocks, "\n".join(prose)


def headings(prose: str) -> list[tuple[int, str]]:
    """(line, heading text) for every ATX heading outside fenced blocks."""
    found = []
    for number, line in enumerate(prose.split("\n"), 1):
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if match:
            found.append((number, match.group(2)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors on its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def links(prose: str) -> list[tuple[int, str]]:
    """(line, target) of every inline link in the prose, inline code spans left out."""
    found = []
    for number, line in enumerate(prose.split("\n"), 1):
        for match in re.finditer(r"\[[^\]]*\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
            found.append((number, match.group(1)))
    return found


@dataclass
class Command:
    page: Path
    line: int
    text: str
    script: str  # path relative to the repository root
    args: list[str]
    complete: bool  # a fenced command line; an inline code span may leave out required arguments

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: {self.text}"


def shell_lines(block: Block) -> list[tuple[int, str]]:
    """Logical lines of a shell block: `\\` continues a line."""
    lines, pending, first = [], "", 0
    for number, line in enumerate(block.text.split("\n"), block.line):
        if not pending:
            first = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append((first, pending + line))
        pending = ""
    if pending:
        lines.append((first, pending))
    return lines


def inline_spans(prose: str) -> list[tuple[int, str]]:
    """(line, text) of inline code spans, which may wrap onto the next line (never across a blank one)."""
    found = []
    for match in re.finditer(r"`([^`]+)`", prose):
        if "\n\n" not in match.group(1):
            found.append((prose.count("\n", 0, match.start()) + 1, " ".join(match.group(1).split())))
    return found


def parse_command(page: Path, line: int, text: str, complete: bool) -> Command | None:
    """A command that runs a project script, or None for any other line (pip, mlflow, a comment)."""
    plain = [w for w in text.split() if not re.match(r"^[A-Za-z_]\w*=", w)]
    if not plain or plain[0] not in RUNNERS:  # a layout line, a comment, pip, mlflow ...
        return None
    try:
        words = shlex.split(text, comments=True)
    except ValueError as err:
        raise AssertionError(f"{page.relative_to(ROOT)}:{line}: cannot split {text!r} as a shell line: {err}") from None
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):  # OMP_NUM_THREADS=1 python ...
        words.pop(0)
    if not words or words[0] not in RUNNERS:
        return None
    for end, word in enumerate(words):
        if word in COMMAND_ENDS:
            words = words[:end]
            break
    for i, word in enumerate(words[1:], 1):
        if word.endswith((".py", ".sh")) and word.split("/")[0] in SCRIPT_DIRS:
            return Command(page, line, text.strip(), word, words[i + 1:], complete)
    return None


def commands() -> list[Command]:
    """Every command line shown in fenced shell blocks and inline code spans of every page."""
    found = []
    for page in pages():
        blocks, prose = split_page(page.read_text(encoding="utf-8"))
        for block in blocks:
            if block.language in SHELL_LANGUAGES:
                for line, text in shell_lines(block):
                    found.append(parse_command(page, line, text, complete=True))
        for line, text in inline_spans(prose):
            found.append(parse_command(page, line, text, complete=False))
    return [c for c in found if c is not None]


def usage_variants(args: list[str]) -> list[list[str]]:
    """The concrete argument lists a usage-style line stands for.

    `[...]` marks an optional part: the brackets go and the content stays (checked as if given); a
    `...` inside brackets (repeat the part before) is dropped. A word `a|b|c` lists alternatives:
    one variant per alternative, the other such words at their first.
    """
    flat, depth = [], 0
    for word in args:
        while word.startswith("[") and not word.startswith("[{"):
            word, depth = word[1:], depth + 1
        closing = 0
        while depth - closing > 0 and word.endswith("]"):
            word, closing = word[:-1], closing + 1
        if word and not (depth and word == "..."):
            flat.append(word)
        depth -= closing
    choices = [w.split("|") if "|" in w and not w.startswith("-") else [w] for w in flat]
    variants = [[c[0] for c in choices]]
    for i, options in enumerate(choices):
        for option in options[1:]:
            variant = list(variants[0])
            variant[i] = option
            variants.append(variant)
    return variants
