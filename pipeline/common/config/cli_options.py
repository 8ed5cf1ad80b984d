"""Command lines generated from a stage's options dataclass, so each option is defined once.

Field `seq_len` becomes `--seq-len`; the type picks the parser type (`Literal` → choices,
`bool` → a switch, `tuple`/`list` → several values); the field's docstring becomes the help text,
with the default appended. A field may rename its flag with `field(metadata={"flag": "--input"})`,
which keeps old flag names (contracts) while the field name says what it holds.

Help comes from the docstrings written under each field, read from the class source with `ast`,
rather than from `field(metadata={"help": ...})`: the docstrings are the project's one convention
for documenting config fields (the JSON config sections use them too), editors show them, and a
second copy in metadata would drift from them.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import textwrap
import types
import typing
from dataclasses import MISSING, dataclass
from typing import Any, TypeVar

from pipeline.common.errors import PipelineError

T = TypeVar("T")


@dataclass(frozen=True)
class CliOption:
    """One field of an options dataclass as it appears on the command line."""

    field: str
    """The dataclass field name (the parsed namespace uses it too)."""
    flag: str
    """The long flag, e.g. `--seq-len`."""
    key: str
    """The flag as a JSON config key (`--seq-len` → `seq_len`), as job configs spell options."""
    hint: Any
    """The field's type hint."""
    default: Any
    """The default value, or `dataclasses.MISSING` when the option is required."""
    help: str
    """The field's docstring (empty when it has none)."""

    @property
    def required(self) -> bool:
        return self.default is MISSING

    @property
    def is_switch(self) -> bool:
        return _base(self.hint) is bool

    def to_argv(self, value: Any) -> list[str]:
        """The command-line words that set this option to `value`."""
        if self.is_switch:
            if value is None:
                return []
            if self.default is False or self.default is MISSING:
                return [self.flag] if value else []
            return [self.flag if value else "--no-" + self.flag[2:]]
        if isinstance(value, (list, tuple)):
            return [self.flag, *map(str, value)]
        return [self.flag, str(value)]


def field_docstrings(cls: type) -> dict[str, str]:
    """The docstring under each field of `cls` (and its dataclass bases), whitespace collapsed."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # no source (frozen or compiled-only install): help stays empty
            continue
        body = ast.parse(source).body[0].body
        for node, following in zip(body, body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def cli_options(cls: type) -> list[CliOption]:
    """Every field of options dataclass `cls`, in definition order, as a command-line option."""
    hints = typing.get_type_hints(cls)
    docs = field_docstrings(cls)
    options = []
    for f in dataclasses.fields(cls):
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = MISSING
        options.append(CliOption(f.name, flag, flag[2:].replace("-", "_"), hints[f.name], default,
                                 docs.get(f.name, "")))
    return options


def add_options(parser: argparse.ArgumentParser, cls: type) -> list[CliOption]:
    """Add one argument per field of `cls` to `parser`.

    Required fields (no default) are not marked required for argparse, so that a script can offer
    modes that need fewer of them (e.g. `shard.py --combine`); `options_from_namespace` reports the
    missing ones, all together, the way argparse would.
    """
    options = cli_options(cls)
    for option in options:
        kwargs: dict[str, Any] = {"dest": option.field, "help": _help_text(option)}
        hint = _base(option.hint)
        origin = typing.get_origin(hint)
        if hint is bool:
            if option.default is False:
                kwargs["action"] = "store_true"
            else:  # default True or None ("decide from other options"): both spellings are needed
                kwargs.update(action=argparse.BooleanOptionalAction,
                              default=None if option.required else option.default)
        else:
            kwargs["default"] = None if option.required else option.default
            if origin is typing.Literal:
                kwargs["choices"] = typing.get_args(hint)
                kwargs["type"] = type(typing.get_args(hint)[0])
            elif origin in (tuple, list):
                item = typing.get_args(hint)[0]
                kwargs["nargs"] = "+" if option.required else "*"
                kwargs["type"] = item
            elif hint in (int, float, str):
                kwargs["type"] = hint
            else:
                raise TypeError(f"{cls.__name__}.{option.field}: no command-line form for {option.hint!r}")
            if option.required:
                kwargs["metavar"] = option.field.upper() if origin not in (tuple, list) else option.key.upper()
        parser.add_argument(option.flag, **kwargs)
    return options


def options_from_namespace(cls: type[T], namespace: argparse.Namespace, parser: argparse.ArgumentParser) -> T:
    """Build `cls` from parsed arguments; missing required options end the program as argparse does."""
    options = cli_options(cls)
    missing = [o.flag for o in options if o.required and getattr(namespace, o.field) is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    values = {}
    for option in options:
        value = getattr(namespace, option.field)
        if typing.get_origin(_base(option.hint)) is tuple and value is not None:
            value = tuple(value)
        values[option.field] = value
    return cls(**values)


def options_from_config(cls: type[T], data: dict[str, Any], source: str, *, exclude: tuple[str, ...] = ()) -> T:
    """Build `cls` from a JSON job config whose keys are the flags' (`seq_len` for `--seq-len`).

    The values go through the same parser as the command line, so a config is checked exactly as
    the job's own command line will be. Options in `exclude` are set by the job itself.
    """
    known = {o.key: o for o in cli_options(cls) if o.field not in exclude}
    problems = [f"{key}: not an option here (known: {', '.join(known)})" for key in data if key not in known]
    problems += [f"{o.key}: required" for o in known.values() if o.required and o.key not in data]
    problems += [f"{key}: expected true or false, got {json.dumps(value)}" for key, value in data.items()
                 if key in known and known[key].is_switch and not isinstance(value, bool)]
    if problems:
        raise PipelineError(f"config {source}: " + "; ".join(problems))
    argv = config_argv(cls, data)
    parser = argparse.ArgumentParser(prog=source, exit_on_error=False)
    add_options(parser, cls)
    try:
        namespace, extra = parser.parse_known_args(argv)
    except argparse.ArgumentError as err:
        raise PipelineError(f"config {source}: {err}") from None
    if extra:
        raise PipelineError(f"config {source}: a list where one value was expected ({' '.join(extra)})")
    return options_from_namespace(cls, namespace, parser)


def config_argv(cls: type, data: dict[str, Any]) -> list[str]:
    """The command-line words for a job config (keys as in `options_from_config`)."""
    known = {o.key: o for o in cli_options(cls)}
    return [word for key, value in data.items() for word in known[key].to_argv(value)]


def _help_text(option: CliOption) -> str:
    text = option.help.rstrip(".") if option.help else ""
    if option.required:
        suffix = "required"
    elif option.default is None or option.default is False:
        return text.replace("%", "%%")
    elif isinstance(option.default, (list, tuple)):
        suffix = "default: " + " ".join(map(str, option.default))
    else:
        suffix = f"default: {option.default}"
    return (f"{text} ({suffix})" if text else f"({suffix})").replace("%", "%%")


def _base(hint: Any) -> Any:
    """`X | None` → `X`: None is the "not given" value of an optional flag."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint
