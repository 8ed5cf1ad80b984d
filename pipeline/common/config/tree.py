"""Typed config trees: JSON → nested dataclasses, `--set a.b=value` overrides, all problems at once.

Every stage's config is a dataclass whose fields are sections (dataclasses), plain values, or lists
of small objects (dataclasses too, such as the corpora of a weighted data mix).
`build_config` reports unknown keys and wrong types together, naming each key by its dotted path,
so a user fixes a config in one round instead of one error per launch.

Each section checks its own values when it is built: its `__post_init__` lists every problem and
hands them to `refuse`, which raises `SectionProblems`. `build_config` collects those too and keeps
the section as built, so the other sections and the top-level cross-section rules still run and all
problems reach the user together; code that builds a section directly gets them as a ValueError.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from pipeline.common.errors import PipelineError

T = TypeVar("T")


class ConfigError(PipelineError):
    """One or more problems in a config, listed one per line."""

    def __init__(self, source: str, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"config {source}: {len(problems)} problem{'s' * (len(problems) != 1)}:\n{lines}")


class SectionProblems(ValueError):
    """Every problem of one config section's own values, raised by its `__post_init__` (see `refuse`)."""

    def __init__(self, section: Any, problems: list[str]):
        self.section = section
        """The section as built, kept so the checks of the sections around it can still run."""
        self.problems = problems
        super().__init__("\n".join(problems))


def refuse(section: Any, problems: list[str]) -> None:
    """End a section's `__post_init__`: raise its problems (each naming the key the user typed), if any."""
    if problems:
        raise SectionProblems(section, problems)


def read_json_config(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise PipelineError(f"config {path}: cannot read: {err.strerror or err}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise PipelineError(f"config {path}: line {err.lineno} column {err.colno}: invalid JSON: {err.msg}") from None
    if not isinstance(data, dict):
        raise PipelineError(f"config {path}: expected a JSON object at the top level")
    return data


def parse_override(text: str) -> tuple[list[str], Any, bool]:
    """`section.key=value` → (path, value, False); `section.key+=[...]` → (path, list, True), whose items are added
    to the key's list. The value is JSON when it parses, else the raw string."""
    key, sep, raw = text.partition("=")
    adds = key.endswith("+")
    key = key.removesuffix("+")
    if not sep or not key.strip():
        raise PipelineError(f"--set {text!r}: expected section.key=value (or section.key+=[items] for a list)")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    if adds and not isinstance(value, list):
        raise PipelineError(f"--set {text!r}: += adds a JSON list's items to the key's list, got {raw!r}")
    return key.strip().split("."), value, adds


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `a.b.c=value` set, creating nested objects as needed; `a.b.c+=[...]` adds
    its items to the list there (an absent key: to an empty one)."""
    data = json.loads(json.dumps(data))
    for text in overrides:
        path, value, adds = parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        if adds:
            present = node.get(path[-1], [])
            if not isinstance(present, list):
                raise PipelineError(f"--set {text!r}: {'.'.join(path)} is {present!r}, not a list to add to")
            value = [*present, *value]
        node[path[-1]] = value
    return data


def build_config(cls: type[T], data: dict[str, Any]) -> tuple[T, list[str]]:
    """Build dataclass `cls` from `data`, with every unknown key and wrong type listed as a problem.

    A section may name the keys of an older spelling in a `RENAMED_KEYS` class variable
    (`{old key: what to write now}`); such a key is refused with that advice.

    A value of the wrong type is replaced by its default, and a section whose `__post_init__` refuses
    its values is kept as built, so that every other check still runs and all problems reach the user
    together.
    """
    config, wrong, refused = build_tree(cls, data)
    return config, wrong + refused


def build_tree(cls: type[T], data: dict[str, Any]) -> tuple[T, list[str], list[str]]:
    """`build_config` with its problems in two lists: unknown keys and wrong types (defaults stand in for
    those values), then what the sections' own checks refused."""
    wrong: list[str] = []
    refused: list[str] = []
    return _build(cls, data, "", wrong, refused), wrong, refused


def _build(cls, data: Any, prefix: str, problems: list[str], refused: list[str]):
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(data, dict):
        problems.append(f"{where}: expected an object, got {json.dumps(data)}")
        data = {}
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    renamed = getattr(cls, "RENAMED_KEYS", {})
    for key in data:
        if key in renamed:
            problems.append(f"{prefix}{key}: this spelling is no longer read; {renamed[key]}")
        elif key not in names:
            problems.append(f"{prefix}{key}: unknown key (known in {where}: {', '.join(sorted(names))})")
    values = {}
    for name in names & data.keys():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = _build(hint, data[name], f"{prefix}{name}.", problems, refused)
        else:
            value, problem = _coerce(data[name], hint)
            if not problem:
                values[name] = value
            elif (items := _build_items(data[name], hint, f"{prefix}{name}", problems, refused)) is not None:
                values[name] = items
            else:
                problems.append(f"{prefix}{name}: expected {problem}, got {json.dumps(data[name])}")
    for f in dataclasses.fields(cls):  # a section left out is built here, so its problems are collected too
        if f.name not in values and dataclasses.is_dataclass(hints[f.name]):
            make = f.default_factory if f.default_factory is not dataclasses.MISSING else hints[f.name]
            values[f.name] = _checked(make, refused)
    return _checked(lambda: cls(**values), refused)


def _checked(make, refused: list[str]):
    """`make()`; a section's `SectionProblems` join `refused` and the section is kept as built."""
    try:
        return make()
    except SectionProblems as err:
        refused += err.problems
        return err.section


def _build_items(value: Any, hint: Any, where: str, problems: list[str], refused: list[str]) -> list | None:
    """A list of objects built item by item, naming the item and key of each problem (wrong values take
    their defaults, as in sections); None when `value` is not a list or `hint` offers no list of dataclasses."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for option in options:
        (item,) = typing.get_args(option) if typing.get_origin(option) is list else (None,)
        if isinstance(value, list) and dataclasses.is_dataclass(item):
            return [_build(item, entry, f"{where}[{i}].", problems, refused) for i, entry in enumerate(value)]
    return None


def _coerce(value: Any, hint: Any) -> tuple[Any, str | None]:
    """Check `value` against a simple type hint; return (value, None) or (None, what was expected)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            coerced, problem = _coerce(value, option)
            if problem is None:
                return coerced, None
        return None, " or ".join(_describe(o) for o in typing.get_args(hint))
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        return (value, None) if value in choices else (None, "one of " + ", ".join(map(json.dumps, choices)))
    if hint is type(None):
        return (None, None) if value is None else (None, "null")
    if hint is bool:
        return (value, None) if isinstance(value, bool) else (None, "true or false")
    if hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return (value, None) if ok else (None, "an integer")
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return (float(value), None) if ok else (None, "a number")
    if hint is str:
        return (value, None) if isinstance(value, str) else (None, "a string")
    if origin is tuple:
        args = typing.get_args(hint)
        if isinstance(value, list) and len(value) == len(args):
            items = [_coerce(v, a) for v, a in zip(value, args, strict=True)]
            if all(p is None for _, p in items):
                return tuple(v for v, _ in items), None
        return None, f"a list of {len(args)} {_describe(args[0])}s"
    if dataclasses.is_dataclass(hint):
        problems: list[str] = []
        built = _build(hint, value, "", problems, problems)
        return (built, None) if not problems else (None, _describe(hint))
    if origin is dict or hint is dict:
        return (value, None) if isinstance(value, dict) else (None, "an object")
    if origin is list:
        (arg,) = typing.get_args(hint)
        if isinstance(value, list):
            items = [_coerce(v, arg) for v in value]
            if all(p is None for _, p in items):
                return [v for v, _ in items], None
        return None, f"a list of {_describe(arg)}s"
    raise TypeError(f"unsupported config type {hint!r}")


def _describe(hint: Any) -> str:
    if dataclasses.is_dataclass(hint):
        return "{" + ", ".join(f.name for f in dataclasses.fields(hint)) + "} object"
    if typing.get_origin(hint) is list:
        return f"list of {_describe(typing.get_args(hint)[0])}s"
    return {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}.get(hint, str(hint))


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` or a dataclass tree → `{"a.b": 1}`, for logging params."""
    if dataclasses.is_dataclass(tree):
        tree = dataclasses.asdict(tree)
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def to_dict(config: Any) -> dict[str, Any]:
    """A dataclass tree as plain JSON-ready data (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def too_small(prefix: str, section: object, minimum: int, *names: str) -> list[str]:
    """`<prefix>.<name>: must be ≥ minimum, got …` for each of the section's `names` below `minimum` (None: unset)."""
    return [f"{prefix}.{name}: must be ≥ {minimum}, got {value}" for name in names
            if (value := getattr(section, name)) is not None and value < minimum]
