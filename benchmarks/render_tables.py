"""Render the docs' benchmark tables from benchmarks/results/*.json, so a figure and its conditions cannot part.

    python benchmarks/render_tables.py            # rewrite the generated regions in place
    python benchmarks/render_tables.py --check    # exit 1 if a page differs from the results

docs/benchmarks.md ("How a benchmark is written") describes the regions, the machine named once and "Other results".
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from harness import RESULTS_DIR, ROOT, cell, render_table

from pipeline.common.atomic_files import write_text_atomic
from pipeline.common.errors import PipelineError, exit_on_pipeline_error

PAGE = ROOT / "docs" / "benchmarks.md"
START = "<!-- generated from benchmarks/results/{name}.json: do not edit -->"
END = "<!-- end generated -->"
REGION = re.compile(r"<!-- generated from benchmarks/results/(?P<name>[^\s]+?)\.json: do not edit -->\n"
                    r"(?P<body>.*?)" + re.escape(END), re.S)
OTHER_HEADING = "## Other results"
MACHINE_START = "<!-- generated machine from benchmarks/results: do not edit -->"
MACHINE_REGION = re.compile(re.escape(MACHINE_START) + r"\n.*?" + re.escape(END), re.S)


def render_headline(headline: dict[str, Any]) -> list[str]:
    verdict = {True: "**met**", False: "**not met**"}
    return [f"- {name}: **{cell(entry.get('value'))}**" + (f" {entry['unit']}" if entry.get("unit") else "")
            + (f" (target {entry['target']}: {verdict.get(entry.get('met'), 'not measured')})" if "target" in entry
               else "") for name, entry in headline.items()]


def load_text(load: list[float] | None) -> str:
    return "not recorded" if load is None else " / ".join(format(x, ".2f") for x in load)


def machine_text(machine: dict[str, Any]) -> str:
    total = machine.get("cores_total")
    parts = [f"{machine.get('cores', '?')} cores" + ("" if total in (None, machine.get("cores")) else f" of {total}")]
    parts += [str(machine[k]) for k in ("cpu_model", "platform") if machine.get(k)]
    return ", ".join(parts + ([f"Python {machine['python']}"] if machine.get("python") else []))


def page_machine(results: dict[str, dict[str, Any]]) -> str | None:
    """The machine most measured results ran on: named once at the top, per result only where it differs."""
    texts = [machine_text(d.get("machine") or {}) for d in results.values() if d.get("provenance") != "transcribed"]
    return max(texts, key=texts.count) if texts else None


def render_conditions(data: dict[str, Any], machine: str | None = None) -> list[str]:
    commit = f"`{(data.get('git_commit') or 'unknown')[:7]}`"
    if data.get("git_dirty"):
        commit += " (with uncommitted changes)"
    if data.get("load_start") is None and data.get("load_end") is None and data.get("load_note"):
        load = data["load_note"]
    else:
        load = (f"{load_text(data.get('load_start'))} at the start, {load_text(data.get('load_end'))} at the end"
                + (" (1 / 5 / 15 min)" if data.get("load_start") or data.get("load_end") else ""))
        if data.get("load_note"):
            load += f"; {data['load_note']}"
    own_machine = machine_text(data.get("machine") or {})
    where = "" if own_machine == machine else f"; machine: {own_machine}"
    # One line, so that a page of many results stays readable; the facts are the same.
    return [f"*Conditions:* command: `{data.get('command', 'not recorded')}`; date: "
            f"{data.get('date', 'not recorded')}{where}; load average: {load}; git commit: {commit}."]


def render_result(data: dict[str, Any], machine: str | None = None) -> str:
    """A result's markdown: tables, then headline and notes as one list, then its conditions on one line (naming its
    machine only where it differs from the page's `machine`)."""
    lines: list[str] = []
    results = data.get("results") or {}
    for table in results.get("tables") or []:
        lines += render_table(table)
    items = render_headline(results.get("headline") or {})
    # `steps`: a per-step log (the GPU check's, tracebacks included) whose figures its tables already show
    rest = {k: v for k, v in results.items() if k not in ("tables", "headline", "steps")}
    if rest:  # figures a benchmark recorded outside tables: shown as written, so none is left out
        items.append("- Other figures: `" + json.dumps(rest, ensure_ascii=False) + "`")
    items += [f"- *Note:* {note}" for note in data.get("notes") or []]
    if study := data.get("study"):
        items.append(f"- *Study:* arms {', '.join(study['arms'])}; metric: {study['metric']}; baseline: "
                     f"{study['baseline']}")
    conditions = render_conditions(data, machine)[0]
    if data.get("provenance") == "transcribed":  # said on the conditions line, which a reader checks for provenance
        source = data.get("transcribed_from") or {}
        commit = source.get("commit")
        at = "" if commit == data.get("git_commit") else f" at commit `{(commit or '?')[:7]}`"  # else named once
        conditions = (f"*Transcribed* from {source.get('file', 'README.md')}{at} (measured before results were "
                      f"recorded as JSON; its command regenerates it). " + conditions)
    # The conditions close the list of figures and notes: one block, no blank line between.
    return "\n".join(lines + items + ["- " + conditions]) + "\n"


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
    """`text` (docs/benchmarks.md) re-rendered, with regions appended for results it lacks."""
    return render_pages(text, {}, results)[0]


def render_pages(text: str, others: dict[str, str], results: dict[str, dict[str, Any]]
                 ) -> tuple[str, dict[str, str]]:
    """docs/benchmarks.md's `text` and the `others` pages (texts by name) with every region re-rendered;
    a result no page places is appended to `text`."""
    placed = set()

    def filler(page: str):
        def fill(match: re.Match) -> str:
            name = match["name"]
            if name not in results:
                raise PipelineError(f"{page} has a region for benchmarks/results/{name}.json, which does "
                                    f"not exist: run the benchmark, or remove the region")
            if name in placed:  # e.g. appended under "Other results", then placed in a section as well
                raise PipelineError(f"two regions for benchmarks/results/{name}.json (the second in {page}): "
                                    f"keep one")
            placed.add(name)
            return region(name, render_result(results[name], machine))
        return fill

    # Without the machine region every result names its own machine, so none goes unstated.
    machine = page_machine(results) if MACHINE_REGION.search(text) else None
    text = MACHINE_REGION.sub(lambda _: f"{MACHINE_START}\nUnless a result says otherwise, it ran on: "
                              f"{machine or 'no result recorded yet'}.\n{END}", text)
    text = REGION.sub(filler("docs/benchmarks.md"), text)
    rendered = {name: REGION.sub(filler(name), other) for name, other in others.items()}
    missing = [name for name in results if name not in placed]
    if missing:
        if OTHER_HEADING not in text:
            text = text.rstrip("\n") + f"\n\n{OTHER_HEADING}\n\nResults not yet placed in a section above.\n"
        for name in missing:
            text = text.rstrip("\n") + f"\n\n### `{name}`\n\n{region(name, render_result(results[name], machine))}\n"
    return text, rendered


def pages_beside(page: Path) -> dict[Path, str]:
    """The other pages of `page`'s folder that hold a generated region, with their texts."""
    texts = {p: p.read_text() for p in sorted(page.parent.glob("*.md")) if p != page}
    return {p: text for p, text in texts.items() if REGION.search(text)}


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the page is stale, without writing it")
    p.add_argument("--page", type=Path, default=PAGE)
    p.add_argument("--results", type=Path, default=RESULTS_DIR)
    a = p.parse_args(argv)
    if not a.page.exists():
        raise PipelineError(f"{a.page}: no such page; give --page")
    others = pages_beside(a.page)
    old = {a.page: a.page.read_text(), **others}
    main_text, rendered = render_pages(old[a.page], {str(p): text for p, text in others.items()},
                                       load_results(a.results))
    new = {a.page: main_text, **{Path(p): text for p, text in rendered.items()}}
    changed = [p for p in old if new[p] != old[p]]
    if a.check:
        for page in changed:
            stale = sorted({m["name"] for m in REGION.finditer(new[page])} - {
                m["name"] for m in REGION.finditer(old[page]) if m.group(0) in new[page]})
            print(f"{page} is stale against {a.results}: regions {', '.join(stale) or '(none)'} differ. "
                  f"Run: python benchmarks/render_tables.py", file=sys.stderr)
        if changed:
            return 1
        print(f"{', '.join(str(p) for p in old)} match {a.results}")
        return 0
    for page in changed:
        write_text_atomic(page, new[page])
        print(f"rewrote {page}")
    if not changed:
        print(f"{a.page} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
