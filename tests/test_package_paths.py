"""The package depends on nothing above it through file paths.

`pipeline/` must work installed from a wheel, where no `launchers/`, `data_prep/` or `configs/`
folder sits beside it. So no code in the package names a path into those folders, and no code
climbs out of the package from its own `__file__` (`parents[2]`, `.parent.parent.parent`). The one
exception is the config-finding module, which knows where the shipped configs are. Stages are
started by module (`python -m pipeline.commands.<stage>`), configs found by `find_config`.
Docstrings are prose for readers and are not checked; every other string is.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"
CONFIG_FINDER = PACKAGE / "common" / "config" / "shipped_configs.py"
OUTSIDE = re.compile(r"(?:^|[/\\])(launchers|data_prep|configs)(?:[/\\]|$)")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
        # An attribute docstring (a string statement after an assignment) is prose too.
        body = getattr(node, "body", None)
        for stmt in body if isinstance(body, list) else []:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                    and isinstance(stmt.value.value, str):
                ids.add(id(stmt.value))
    return ids


def _mentions_file(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(node))


def _levels_up(node: ast.AST) -> int | None:
    """How many folders above `__file__` an expression climbs: `parents[k]` is k+1, each `.parent` one."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents" \
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int) \
            and _mentions_file(node.value.value):
        return node.slice.value + 1 + (_levels_up(node.value.value) or 0)
    if isinstance(node, ast.Attribute) and node.attr == "parent" and _mentions_file(node.value):
        return 1 + (_levels_up(node.value) or 0)
    return None


def upward_paths(source: str, module: Path) -> list[str]:
    """Each string naming a path into launchers/, data_prep/ or configs/, and each climb out of the package."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    depth = len(module.relative_to(PACKAGE).parts)  # parents[depth - 1] of the file is the package itself
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            if OUTSIDE.search(node.value):
                found.append(f"line {node.lineno}: {node.value!r} is a path outside the package")
        levels = _levels_up(node)
        if levels is not None and levels > depth:  # one message per line, however long the chain
            found.append(f"line {node.lineno}: climbs from __file__ out of the package")
    return sorted(set(found))


def package_modules() -> list[Path]:
    """Every module but the config finder, the one place that knows where configs are."""
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if p != CONFIG_FINDER and "shipped_configs" not in p.relative_to(PACKAGE).parts[:1])


@pytest.mark.parametrize("module", package_modules(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_module_reaches_outside_the_package_by_path(module):
    assert not upward_paths(module.read_text(), module), "\n".join(upward_paths(module.read_text(), module))


def test_the_check_finds_the_paths_it_is_meant_to_forbid():
    module = PACKAGE / "ablation" / "runner.py"
    source = '''
"""A docstring may say data_prep/shard.py."""
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
GLUE = ROOT / "configs" / "glue"
SCRIPT = "launchers/pretrain.py"
UP = Path(__file__).parent.parent.parent
HELP = "e.g. an export folder"
HERE = Path(__file__).resolve().parents[1]
'''
    found = upward_paths(source, module)
    assert [f.split(":")[0] for f in found] == ["line 4", "line 5", "line 6", "line 7"], found


def test_the_config_finder_is_the_only_module_exempted():
    assert CONFIG_FINDER.is_file()
    assert upward_paths(CONFIG_FINDER.read_text(), CONFIG_FINDER), "the finder names configs/: the check must see it"
