"""Render docs/benchmarks.md's tables from benchmarks/results/*.json, so a figure and its conditions cannot part.

    python benchmarks/render_tables.py            # rewrite the generated regions in place
    python benchmarks/render_tables.py --check    # exit 1 if the page differs from the results

The page's prose is written by hand. Each result is shown in a region between two markers,

    <!-- generated from benchmarks/results/NAME.json: do not edit -->
    ...
    <!-- end generated -->

whose content is the result's tables, its headline (with each target and whether it was met), and
right under them its conditions on one line: command, date, machine, load average at the start and
the end, and git commit. A result transcribed from an older README says so and gives the command that
regenerates it. A result with no region yet is appended under "Other results", so a new
benchmark's figure shows up (and `--check` fails) until someone places it in the page.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from pipeline.common.atomic_files import write_text_atomic  # noqa: E402
from pipeline.common.errors import PipelineError, exit_on_pipeline_error  # noqa: E402

PAGE = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "benchmarks" / "results"
START = "<!-- generated from benchmarks/results/{name}.json: do not edit -->"
END = "<!-- end generated -->"
REGION = re.compile(r"<!-- generated from benchmarks/results/(?P<name>[^\s]+?)\.json: do not edit -->\n"
                    r"(?P<body>.*?)" + re.escape(END), re.S)
OTHER_HEADING = "## Other results"


def cell(value: Any) -> str:
    """One table cell: text as written, numbers compactly, a '|' escaped so it cannot split the row."""
    if value is None:
        text = "—"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        text = format(value, ".6g")
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(table: dict[str, Any]) -> list[str]:
    columns = table.get("columns") or list(dict.fromkeys(k for row in table["rows"] for k in row))
    lines = []
    if table.get("title"):
        lines += [f"**{table['title']}**", ""]
    lines.append("| " + " | ".join(cell(c) for c in columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for row in table["rows"]:
        lines.append("| " + " | ".join(cell(row.get(c)) for c in columns) + " |")
    if table.get("note"):
        lines += ["", table["note"]]
    return lines + [""]


def tables_of(tables: Any) -> list[dict[str, Any]]:
    """`results["tables"]` as a list of {title, columns, rows}: also accepts {title: rows or table} and bare rows."""
    if not tables:
        return []
    if isinstance(tables, dict):
        return [{"title": title, **(t if isinstance(t, dict) else {"rows": t})} for title, t in tables.items()]
    if all(isinstance(t, dict) and "rows" in t for t in tables):
        return list(tables)
    return [{"rows": list(tables)}]  # one table given as its rows


def verdict(met: bool | None) -> str:
    return {True: "**met**", False: "**not met**"}.get(met, "not measured")


def render_headline(headline: dict[str, Any]) -> list[str]:
    lines = []
    for name, entry in headline.items():
        entry = entry if isinstance(entry, dict) else {"value": entry}
        text = f"- {name}: **{cell(entry.get('value'))}**"
        if entry.get("unit"):
            text += f" {entry['unit']}"
        if "target" in entry:
            text += f" (target {entry['target']}: {verdict(entry.get('met'))})"
        lines.append(text)
    return lines + [""] if lines else []


def load_text(load: Any) -> str:
    if load is None:
        return "not recorded"
    if isinstance(load, list | tuple):
        return " / ".join(format(x, ".2f") for x in load) + " (1 / 5 / 15 min)"
    return str(load)


def machine_text(machine: dict[str, Any]) -> str:
    parts = [f"{machine.get('cores', '?')} cores"]
    if machine.get("cores_total") not in (None, machine.get("cores")):
        parts[0] += f" of {machine['cores_total']}"
    parts += [str(machine[k]) for k in ("cpu_model", "platform") if machine.get(k)]
    if machine.get("python"):
        parts.append(f"Python {machine['python']}")
    return ", ".join(parts)


def render_conditions(data: dict[str, Any]) -> list[str]:
    commit = f"`{(data.get('git_commit') or 'unknown')[:7]}`"
    if data.get("git_dirty"):
        commit += " (with uncommitted changes)"
    if data.get("load_start") is None and data.get("load_end") is None and data.get("load_note"):
        load = data["load_note"]
    else:
        load = f"{load_text(data.get('load_start'))} at the start, {load_text(data.get('load_end'))} at the end"
        if data.get("load_note"):
            load += f"; {data['load_note']}"
    # One line, so that a page of many results stays readable; the facts are the same.
    return [f"*Conditions of `{data.get('benchmark', '?')}`:* command: `{data.get('command', 'not recorded')}`; "
            f"date: {data.get('date', 'not recorded')}; machine: {machine_text(data.get('machine') or {})}; "
            f"load average: {load}; git commit: {commit}."]


def render_result(data: dict[str, Any]) -> str:
    """A result's markdown: tables, headline, notes, then its conditions (and provenance) on one line."""
    lines: list[str] = []
    results = data.get("results") or {}
    for table in tables_of(results.get("tables")):
        lines += render_table(table)
    if results.get("headline"):
        lines += render_headline(results["headline"])
    rest = {k: v for k, v in results.items() if k not in ("tables", "headline")}
    if rest:  # figures a benchmark recorded outside tables: shown as written, so none is left out
        lines += ["Other figures: `" + json.dumps(rest, ensure_ascii=False) + "`", ""]
    for note in data.get("notes") or []:
        lines += [f"Note: {note}", ""]
    conditions = render_conditions(data)
    if data.get("provenance") == "transcribed":  # said on the conditions line, which a reader checks for provenance
        source = data.get("transcribed_from") or {}
        conditions[0] = (f"*Transcribed* from {source.get('file', 'README.md')} at commit "
                         f"`{(source.get('commit') or '?')[:7]}` (measured before results were recorded as JSON); "
                         f"rerun `{data.get('command')}` to regenerate. " + conditions[0])
    return "\n".join(lines + conditions) + "\n"


def load_results(folder: Path) -> dict[str, dict[str, Any]]:
    results = {}
    for path in sorted(folder.glob("*.json")):
        try:
            results[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise PipelineError(f"{path}: not valid JSON ({err}); rerun the benchmark that writes it") from None
    return results


def region(name: str, body: str) -> str:
    return f"{START.format(name=name)}\n{body}{END}"  # an HTML comment line needs no blank line around it


def render_page(text: str, results: dict[str, dict[str, Any]]) -> str:
    """`text` with every generated region re-rendered, and regions appended for results the page lacks."""
    placed = set()

    def fill(match: re.Match) -> str:
        name = match["name"]
        if name not in results:
            raise PipelineError(f"docs/benchmarks.md has a region for benchmarks/results/{name}.json, which does "
                                f"not exist: run the benchmark, or remove the region")
        if name in placed:  # e.g. appended under "Other results", then placed in a section as well
            raise PipelineError(f"docs/benchmarks.md has two regions for benchmarks/results/{name}.json: keep one")
        placed.add(name)
        return region(name, render_result(results[name]))

    text = REGION.sub(fill, text)
    missing = [name for name in results if name not in placed]
    if missing:
        if OTHER_HEADING not in text:
            text = text.rstrip("\n") + f"\n\n{OTHER_HEADING}\n\nResults not yet placed in a section above.\n"
        for name in missing:
            text = text.rstrip("\n") + f"\n\n### `{name}`\n\n{region(name, render_result(results[name]))}\n"
    return text


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the page is stale, without writing it")
    p.add_argument("--page", type=Path, default=PAGE)
    p.add_argument("--results", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    if not a.page.exists():
        raise PipelineError(f"{a.page}: no such page; give --page")
    text = a.page.read_text()
    new = render_page(text, load_results(a.results))
    if a.check:
        if new != text:
            stale = sorted({m["name"] for m in REGION.finditer(new)} - {
                m["name"] for m in REGION.finditer(text) if m.group(0) in new})
            print(f"{a.page} is stale against {a.results}: regions {', '.join(stale) or '(none)'} differ. "
                  f"Run: python benchmarks/render_tables.py", file=sys.stderr)
            return 1
        print(f"{a.page} matches {a.results}")
        return 0
    if new != text:
        write_text_atomic(a.page, new)
        print(f"rewrote {a.page}")
    else:
        print(f"{a.page} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
