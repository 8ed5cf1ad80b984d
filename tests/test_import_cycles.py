"""No import circle in `pipeline/` or `benchmarks/`: every import counts, inside functions and `if TYPE_CHECKING:` too.

A circle means neither module can be read (or loaded) without the other; the config modules, which
everything imports, are where one grows most easily. The graph comes from each file's syntax tree, so
an import that only runs late (inside a function) still closes a circle here, as it would for a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"
BENCHMARKS = PACKAGE.parent / "benchmarks"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> dict[str, int]:
    """The pipeline modules `path` imports anywhere in it ({module: first line}); `from a import b` counts
    a.b when b is a module, else a."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                     for alias in node.names]
        else:
            continue
        for name in names:
            if name in modules:
                found.setdefault(name, node.lineno)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, dict[str, int]]:
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    return {name: imports_of(path, set(paths)) for name, path in paths.items()}


def benchmark_graph(root: Path = BENCHMARKS) -> dict[str, dict[str, int]]:
    """The benchmarks import each other as top-level modules (`from harness import ...`), as when run."""
    paths = {path.stem: path for path in sorted(root.glob("*.py"))}
    return {name: imports_of(path, set(paths)) for name, path in paths.items()}


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def described(graph: dict[str, dict[str, int]]) -> str:
    return "\n\n".join("\n".join(f"  {a} -> {b} (line {graph[a][b]})" for a in circle for b in graph[a] if b in circle)
                       for circle in circles(graph))


def test_no_module_of_the_package_imports_itself_back_through_others():
    graph = import_graph()
    assert "pipeline.pretrain.config" in graph and graph["pipeline.pretrain.preflight"], "the graph was not read"
    assert not circles(graph), "import circles:\n" + described(graph)


def test_no_benchmark_module_imports_itself_back_through_others():
    graph = benchmark_graph()
    assert "harness" in graph["render_tables"] and "gpu_runs" in graph["gpu_check"], "the graph was not read"
    assert not circles(graph), "import circles:\n" + described(graph)


def test_the_walk_sees_an_import_inside_a_function_close_a_circle(tmp_path):
    """The check itself: a late import is still an arrow."""
    package = tmp_path / "pipeline"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text("def load():\n    from pipeline.checks import problems\n")
    (package / "checks.py").write_text("from pipeline import config\n")
    (package / "apart.py").write_text("import pipeline.checks\n")
    assert circles(import_graph(package)) == [["pipeline.checks", "pipeline.config"]]
