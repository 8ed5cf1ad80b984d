"""The embedded default corpus: English prose that ships with Python itself, so it exists offline.

Two sources, both part of every CPython install:
- `pydoc_data.topics`: the language reference and library documentation topics that `help()`
  shows (one document per topic);
- the docstrings of the standard library, read with `ast` from the source files rather than by
  importing modules (importing `antigravity` opens a web browser, `this` prints, `tkinter` may
  fail), one document per module, class or function docstring.

Records are written as JSON lines `{"text", "source", "kind"}`; `kind` ("topic" or
"docstring") and `source` let later stages build a labelled task from the same text. The
content depends on the Python version, and is deterministic for a given one.
"""

from __future__ import annotations

import ast
import json
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path

from pipeline.common.atomic_files import write_atomic

MIN_DOCSTRING_CHARS = 200
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "__pycache__",
             "ensurepip", "turtledemo", "config-3"}


def iter_topic_records() -> Iterator[dict]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        text = topics[name].strip()
        if text:
            yield {"text": text, "source": f"topic:{name}", "kind": "topic"}


def iter_docstring_records(stdlib: Path | None = None, min_chars: int = MIN_DOCSTRING_CHARS) -> Iterator[dict]:
    stdlib = Path(stdlib or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py")
                   if not any(part in SKIP_DIRS or part.startswith("config-") for part in
                              p.relative_to(stdlib).parts))
    for path in files:
        module = ".".join(path.relative_to(stdlib).with_suffix("").parts).removesuffix(".__init__")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escape sequences in old modules
                tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node, clean=True)
                if doc and len(doc) >= min_chars:
                    name = module if isinstance(node, ast.Module) else f"{module}.{node.name}"
                    yield {"text": doc, "source": f"docstring:{name}", "kind": "docstring"}


def write_embedded_corpus(out: Path, max_bytes: int | None = None) -> dict:
    """Write the corpus as JSON lines to `out` (atomically); returns counts."""
    lines: list[str] = []
    size = 0
    counts = {"topic": 0, "docstring": 0}
    for record in (*iter_topic_records(), *iter_docstring_records()):
        line = json.dumps(record, ensure_ascii=False)
        if max_bytes is not None and size + len(line) > max_bytes:
            break
        lines.append(line)
        size += len(line) + 1
        counts[record["kind"]] += 1
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, ("\n".join(lines) + "\n").encode())
    return {"documents": len(lines), "bytes": size, **counts,
            "python": ".".join(map(str, sys.version_info[:3]))}
