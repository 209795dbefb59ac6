"""No import cycles inside harness, lazy (function-level) imports included.

A cycle that only lazy imports close still ties two modules into one: neither can
be read, tested or moved without the other. This walks every ``import`` statement
of ``harness/`` and fails naming the cycle.
"""

import ast
from pathlib import Path

import harness

ROOT = Path(harness.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _target(module: str, name: str | None) -> str:
    """``from module import name``: the submodule ``module.name`` where one exists, else ``module``."""
    if name is not None:
        sub = ROOT.parent.joinpath(*f"{module}.{name}".split("."))
        if sub.with_suffix(".py").exists() or (sub / "__init__.py").exists():
            return f"{module}.{name}"
    return module


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = _module_name(path)
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name.startswith("harness"))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("harness"):
                edges.update(_target(node.module, a.name) for a in node.names)
        edges.discard(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_harness_has_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle_through_lazy_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
