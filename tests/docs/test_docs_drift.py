"""The documentation cannot drift from the code.

Pages: README.md, docs/*.md, configs/README.md and pipeline/README.md.

Commands. Every command line shown in a fenced shell block (```bash, sh, shell, console or no
language) and in an inline code span that runs a project script (`python`, `deepspeed`, `torchrun`,
`accelerate launch` or `bash`, after any `VAR=value` assignments, with a script under launchers/,
data_prep/, benchmarks/ or docs/) names a script that exists, and a Python script accepts the
arguments with its own parser: `build_parser()` where the script has one, else the parser its
`main()` builds, stopped at its `parse_args` call before any work. Reading rules:
- `\\` continues a line; `# ...` is a comment; `&&`, `;` or `|` ends the command.
- Flags are spelled in full (no argparse abbreviations). Values are free, flags and choices are
  not: a placeholder value (`DIR`, `N`, `FILE_OR_DIR`, `<export>`, `...`) that a typed flag cannot
  convert is accepted; an unknown flag, a bad choice or a real value of the wrong type fails.
- `[...]` marks an optional part: the brackets go and the content is checked as if given; a `...`
  inside brackets (repeat the part before) is dropped.
- A word `a|b|c` lists alternatives: the command is checked once with each.
- A fenced line is a whole command: its required arguments must be there. An inline span may name
  a script with a flag or two, so it may leave required arguments out.

Config keys. Every key given with `--set`, `--pretrain-set` or `--finetune-set` (in a command or in
prose) exists in the config dataclasses: in the pretraining config for pretrain.py, `submit.py
pretrain` and `--pretrain-set`; in the fine-tuning config for finetune.py, `submit.py finetune` and
`--finetune-set`; in either elsewhere. The syntax's own names (`--set section.key=value`,
`--set KEY=VALUE`, `a.b`) are not keys. Every dotted key that opens an inline code span
(`train.max_steps`, `masking.unit=token`, `data.use_datasets: true`) exists in one config or the
other; a file name such as `train.tsv` is not a key. Every ```json block is a pretraining or fine-tuning config
(or a fragment of one, such as `"data": {...}`) or an ablation study file, and loads through the
config tree without a problem.

Names. Every repository path in an inline code span (`pipeline/pretrain/step/engine.py`, `configs/tiny.json`,
`tests/...`) exists, unless it holds a placeholder (`<task>`, `*`, `NNNN`); every dotted name under
`pipeline.` (`pipeline.hub.Encoder`) imports.

Structure. No heading appears twice on one page; no placeholder tokens (PLACEHOLDER, TODO, TBD, XXX,
FIXME); every relative link resolves, and its #anchor names a heading of the page it points at.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import re
import sys
from functools import cache
from unittest import mock

import pytest
from doc_pages import (
    PLACEHOLDER_TOKENS,
    ROOT,
    Command,
    commands,
    headings,
    inline_spans,
    links,
    pages,
    slug,
    split_page,
    usage_variants,
)

from pipeline.ablation.studies import Study, study_problems
from pipeline.common.config.tree import apply_overrides, build_config, build_tree
from pipeline.finetune.config import FinetuneConfig
from pipeline.pretrain.config import PretrainConfig

SYNTAX_KEYS = {"KEY", "section.key", "a.b", "a.b.c"}  # how the docs spell the --set syntax itself
PLACEHOLDER_VALUE = re.compile(r"^(<[^>]*>|\.\.\.|[A-Z][A-Z0-9_]*)$")
CONFIGS = {"pretraining": PretrainConfig, "fine-tuning": FinetuneConfig}
COMMANDS = commands()


def page_id(page) -> str:
    return str(page.relative_to(ROOT))


# ---- commands ----------------------------------------------------------------------------------

class _Captured(BaseException):  # BaseException: passes through a script's `except Exception`
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


class DocCommandError(Exception):
    pass


@cache
def load_script(script: str):
    folder = str((ROOT / script).parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # the scripts' own `import _bootstrap`, `import harness`
    name = "docs_drift_" + re.sub(r"\W", "_", script)
    spec = importlib.util.spec_from_file_location(name, ROOT / script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as importlib's recipe: a script's dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def script_parser(script: str) -> argparse.ArgumentParser:
    """A fresh parser of the script: its `build_parser()`, or the one its `main()` builds."""
    module = load_script(script)
    if hasattr(module, "build_parser"):
        return module.build_parser()

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture), mock.patch.object(sys, "argv", [script]):
        try:
            module.main()
        except _Captured as captured:
            return captured.parser
    raise AssertionError(f"{script}: main() parsed no command line; give it a build_parser()")


def lenient(parser: argparse.ArgumentParser, *, required: bool) -> argparse.ArgumentParser:
    """Accept placeholder values for typed flags; report errors as exceptions, not exits."""
    def fail(message):
        raise DocCommandError(message)

    parser.error = fail
    parser.allow_abbrev = False  # a page spells a flag out in full
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                lenient(sub, required=required)
        if not required:
            action.required = False
        if action.type is not None and callable(action.type):
            action.type = _placeholder_tolerant(action.type)
    if not required:
        for group in parser._mutually_exclusive_groups:
            group.required = False
    return parser


def _placeholder_tolerant(convert):
    def tolerant(value):
        try:
            return convert(value)
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            if PLACEHOLDER_VALUE.match(value):
                return value
            raise

    tolerant.__name__ = getattr(convert, "__name__", repr(convert))
    return tolerant


def parse_documented(command: Command) -> list[argparse.Namespace]:
    """Parse every variant of a documented command; DocCommandError names the first that fails."""
    namespaces = []
    for args in usage_variants(command.args):
        parser = lenient(script_parser(command.script), required=command.complete)
        try:
            namespaces.append(parser.parse_args(args))
        except SystemExit as stop:  # --help, shown in a doc
            if stop.code not in (0, None):
                raise
        except DocCommandError as err:
            raise DocCommandError(f"{command}\n  {command.script} {' '.join(args)}\n  -> {err}") from None
    return namespaces


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{page_id(c.page)}:{c.line}" for c in COMMANDS])
def test_every_documented_command_parses_with_its_scripts_own_parser(command):
    assert (ROOT / command.script).is_file(), f"{command}\n  -> {command.script} does not exist"
    if not command.script.endswith(".py"):
        return
    problem = None
    try:
        parse_documented(command)
    except DocCommandError as err:
        problem = str(err)
    if problem:
        pytest.fail(problem, pytrace=False)


def test_the_docs_show_the_commands_a_user_types():
    shown = {c.script for c in COMMANDS}
    for script in ("launchers/pretrain.py", "launchers/finetune.py", "launchers/submit.py", "launchers/ablate.py",
                   "launchers/compare.py", "launchers/predict.py", "data_prep/shard.py",
                   "data_prep/train_tokenizer.py", "data_prep/verify_shards.py", "launchers/demo.sh"):
        assert script in shown, f"no page shows a command running {script}"


# ---- config keys -------------------------------------------------------------------------------

def unknown_keys(config: type, overrides: list[str]) -> list[str]:
    """The config tree's own 'unknown key' problems for these `key=value` overrides."""
    data = apply_overrides({}, [f"{o.partition('=')[0]}=0" for o in overrides])
    _, problems = build_config(config, data)
    return [p for p in problems if "unknown key" in p]


def key_problems(key_value: str, trees: list[str]) -> list[str]:
    """Problems of one override against the named trees; none if it exists in any of them."""
    found = [unknown_keys(CONFIGS[t], [key_value]) for t in trees]
    if any(not f for f in found):
        return []
    return [f"{t} config: {p}" for t, f in zip(trees, found, strict=True) for p in f]


def overrides_of(command: Command, namespace: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(override, the config trees it may address) for each --set-style flag of a parsed command."""
    either = list(CONFIGS)
    plain = {"launchers/pretrain.py": ["pretraining"], "launchers/finetune.py": ["fine-tuning"]}.get(command.script)
    if command.script == "launchers/submit.py":
        plain = {"pretrain": ["pretraining"], "finetune": ["fine-tuning"]}.get(getattr(namespace, "job", None))
    # The benchmarks address one arm or recipe as `--set ARM:KEY=VALUE`: the key after the prefix is checked.
    found = [(re.sub(r"^[\w-]+:(?=[\w.]+=)", "", o), plain or either) for o in getattr(namespace, "set", None) or []]
    found += [(o, ["pretraining"]) for o in getattr(namespace, "pretrain_set", None) or []]
    found += [(o, ["fine-tuning"]) for o in getattr(namespace, "finetune_set", None) or []]
    return found


SET_COMMANDS = [c for c in COMMANDS if c.script.endswith(".py") and re.search(r"-set\b", " ".join(c.args))]


@pytest.mark.parametrize("command", SET_COMMANDS, ids=[f"{page_id(c.page)}:{c.line}" for c in SET_COMMANDS])
def test_every_key_a_documented_command_sets_exists_in_its_config(command):
    namespaces = parse_documented(command)  # a parse error is reported by the test above
    problems = [f"--set {o}: {p}" for ns in namespaces for o, trees in overrides_of(command, ns)
                for p in key_problems(o, trees)]
    assert not problems, f"{command}\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_every_set_key_in_the_prose_exists_in_a_config(page):
    text = page.read_text(encoding="utf-8")
    problems = []
    for match in re.finditer(r"--(pretrain-|finetune-)?set[ =]+'?([A-Za-z_][\w.]*)=", text):
        trees = {"pretrain-": ["pretraining"], "finetune-": ["fine-tuning"]}.get(match.group(1), list(CONFIGS))
        if match.group(2) in SYNTAX_KEYS:
            continue
        line = text.count("\n", 0, match.start()) + 1
        problems += [f"line {line}: --set {match.group(2)}=…: {p}" for p in key_problems(match.group(2) + "=", trees)]
    assert not problems, f"{page_id(page)}:\n  " + "\n  ".join(problems)


SECTIONS = sorted({f.name for cls in CONFIGS.values() for f in dataclasses.fields(cls)})
DOTTED_KEY = re.compile(rf"^((?:{'|'.join(SECTIONS)})(?:\.\w+)+)(?:[=: ]|$)")
FILE_SUFFIX = re.compile(r"\.(tsv|csv|json|jsonl|txt|md|py|zst|gz|png|parquet)$")


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_every_dotted_config_key_in_the_prose_exists_in_a_config(page):
    """`train.max_steps`, `masking.unit=token`, `data.use_datasets: true`: a key of one config or the other."""
    problems = []
    for line, span in inline_spans(split_page(page.read_text(encoding="utf-8"))[1]):
        match = DOTTED_KEY.match(span)
        if match and not FILE_SUFFIX.search(match.group(1)):
            key = match.group(1)
            problems += [f"line {line}: {key}: {p}" for p in key_problems(key + "=0", list(CONFIGS))]
    assert not problems, f"{page_id(page)}:\n  " + "\n  ".join(problems)


def json_snippet_problems(obj: dict) -> list[str]:
    """A config, a config fragment or a study file: what its config tree says is wrong with it."""
    if "arms" in obj:
        study, problems = build_config(Study, obj)
        problems += study_problems(study)
        for i, arm in enumerate(study.arms):
            problems += [f"arms[{i}].set: {p}" for key in arm.set for p in key_problems(f"{key}=0", ["pretraining"])]
        return problems
    kinds = {name: cls for name, cls in CONFIGS.items() if obj.keys() <= {f.name for f in dataclasses.fields(cls)}}
    if not kinds:
        return [f"top-level keys {sorted(obj)} are neither a pretraining nor a fine-tuning config's sections "
                "(show other JSON as ```text)"]
    # A fragment's keys and types; the values' rules need the whole config, which a fragment is not.
    found = {name: build_tree(cls, obj)[1] for name, cls in kinds.items()}
    return [] if any(not p for p in found.values()) else [f"{n} config: {p}" for n, ps in found.items() for p in ps]


JSON_BLOCKS = [(page, block) for page in pages() for block in split_page(page.read_text(encoding="utf-8"))[0]
               if block.language == "json"]


@pytest.mark.parametrize("page, block", JSON_BLOCKS, ids=[f"{page_id(p)}:{b.line}" for p, b in JSON_BLOCKS])
def test_every_json_snippet_loads_through_its_config_tree(page, block):
    for text in (block.text, "{" + block.text + "}"):  # a whole config, or a fragment such as "data": {...}
        try:
            obj = json.loads(text)
            break
        except json.JSONDecodeError:
            continue
    else:
        pytest.fail(f"{page_id(page)}:{block.line}: not JSON, nor a fragment of a JSON object", pytrace=False)
    problems = json_snippet_problems(obj)
    assert not problems, f"{page_id(page)}:{block.line}:\n  " + "\n  ".join(problems)


# ---- names -------------------------------------------------------------------------------------

REPO_PATH = re.compile(r"^(pipeline|launchers|data_prep|benchmarks|configs|tests|docs)/[\w./-]*$")
DOTTED_NAME = re.compile(r"^(pipeline(?:\.\w+)+)")


def resolves(dotted: str) -> bool:
    """Whether `pipeline.a.b.Name` is an importable module, or an attribute of the longest one that is."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_every_path_and_import_name_in_the_prose_exists(page):
    problems = []
    for line, span in inline_spans(split_page(page.read_text(encoding="utf-8"))[1]):
        word = span.split()[0] if span.split() else ""
        if REPO_PATH.match(word) and not re.search(r"[<*{]|NNN", word) and not (ROOT / word).exists():
            problems.append(f"line {line}: {word} does not exist")
        if (name := DOTTED_NAME.match(word)) and not resolves(name.group(1)):
            problems.append(f"line {line}: {name.group(1)} does not import")
    assert not problems, f"{page_id(page)}:\n  " + "\n  ".join(problems)


# ---- structure ---------------------------------------------------------------------------------

@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_no_heading_appears_twice_on_a_page(page):
    seen: dict[str, int] = {}
    repeats = []
    for line, text in headings(split_page(page.read_text(encoding="utf-8"))[1]):
        if text in seen:
            repeats.append(f"line {line}: {text!r} (first at line {seen[text]})")
        seen.setdefault(text, line)
    assert not repeats, f"{page_id(page)} repeats headings:\n  " + "\n  ".join(repeats)


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_no_placeholder_tokens(page):
    text = page.read_text(encoding="utf-8")
    found = [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in PLACEHOLDER_TOKENS.finditer(text)]
    assert not found, f"{page_id(page)} holds placeholders:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_every_relative_link_resolves(page):
    problems = []
    for line, target in links(split_page(page.read_text(encoding="utf-8"))[1]):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"line {line}: {target}: {path} does not exist")
        elif anchor and resolved.suffix == ".md":
            anchors = {slug(h) for _, h in headings(split_page(resolved.read_text(encoding="utf-8"))[1])}
            if anchor not in anchors:
                problems.append(f"line {line}: {target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert not problems, f"{page_id(page)}:\n  " + "\n  ".join(problems)
