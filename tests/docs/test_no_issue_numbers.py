"""Code and docs describe what they do, not which tracker issue asked for it.

An issue number ("issue 20"), one of its sections ("§2") or one of its numbered targets ("target 3")
means nothing to a reader without the tracker, and goes stale when the issue closes. Sections of
papers and standards ("RoBERTa §4.2", "RFC 8878 §3.1.1.1") are citations and stay.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ["pipeline", "benchmarks", "launchers", "data_prep", "docs", "configs", "tests", "README.md",
           "pyproject.toml", ".ci"]
SUFFIXES = {".py", ".md", ".json", ".toml", ".txt", ".sh", ".cfg", ".yaml", ".yml", ""}
THIS_FILE = Path(__file__).resolve()

ISSUE = re.compile(r"\bissues?\s+#?\d+", re.I)
NUMBERED_TARGET = re.compile(r"\btargets?\s+\d\b(?![.,]\d)", re.I)  # "target 3", not "target 6.068" or "15%"
SECTION = re.compile(r"§\s*\d")
CITED_WORK = re.compile(r"RoBERTa|RFC\s*\d+|et al\.|paper", re.I)  # a § of a paper or standard


def citations(line: str) -> list[str]:
    line = line.replace("\\n", " ").replace("\\t", " ")  # "\nTarget 2" in a string literal has no word boundary
    found = [m.group(0) for pattern in (ISSUE, NUMBERED_TARGET) for m in pattern.finditer(line)]
    if SECTION.search(line) and not CITED_WORK.search(line):
        found.append(SECTION.search(line).group(0))
    return found


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                      and ".venv" not in p.parts and "__pycache__" not in p.parts]
    return [p for p in sorted(files) if p.resolve() != THIS_FILE]


@pytest.mark.parametrize("line, expected", [
    ("Issue 20 §2, target 2: the pipeline reaches", ["Issue 20", "target 2", "§2"]),
    ("## This release (issues 20–23)", ["issues 20"]),
    ("see #12 and issue #7", ["issue #7"]),
    ("Made for target 3 (SST-2)", ["target 3"]),
    ("the plateau work (§2)", ["§2"]),
    ('lines.append(f"\\nTarget 2 is timed")', ["Target 2"]),
    ("FULL-SENTENCES (Liu et al. 2019, §4.2)", []),
    ("RoBERTa §4.2: removing NSP", []),
    ("unigram entropy 7.068 nats, target 6.068", []),
    ("realised over 1,261,056 tokens, target 15%", []),
    ("(target ≥ 2×: **met**)", []),
])
def test_the_check_tells_an_issue_citation_from_a_figure_or_a_paper(line, expected):
    assert citations(line) == expected


def test_no_code_or_doc_cites_an_issue_number_or_section():
    assert len(scanned_files()) > 100
    offenders = []
    for path in scanned_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if found := citations(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {', '.join(found)}")
    assert not offenders, ("say what is measured or why, not which issue asked for it:\n  "
                           + "\n  ".join(offenders))
