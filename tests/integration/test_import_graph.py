"""The product and the harness have no import cycle, counting imports made only for type checking
or inside functions: a cycle is where a newcomer cannot tell which part builds on which.

The graph is read from the source (ast), so it sees imports that no test happens to execute.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# (directory to scan, the import root its absolute imports are relative to)
TREES = [(ROOT / "cni_plugin", ROOT), (ROOT / "publisher", ROOT),
         (ROOT / "scripts" / "harness", ROOT / "scripts" / "harness")]


def _module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for tree, base in TREES:
        for path in sorted(tree.rglob("*.py")):
            found[_module_name(path, base)] = path
    return found


def _targets(node: ast.AST, here: str, is_pkg: bool, known: dict[str, Path]) -> set[str]:
    """The known modules one import statement names (a name imported from a package may be a module)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            pkg = here.split(".") if is_pkg else here.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    out = set()
    for name in names:
        while name and name not in known:  # `import a.b.c` also loads a.b: keep the deepest known
            name = name.rpartition(".")[0]
        if name and name != here:
            out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {}
    for mod, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= _targets(node, mod, path.name == "__init__.py", known)
        # a package's own __init__ is loaded by every module below it: not an edge worth a cycle
        graph[mod] = {d for d in deps if not mod.startswith(d + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_reader_sees_a_planted_cycle():
    # the control: two modules importing each other, one only for type checking, are found
    graph = {"a.x": {"a.y"}, "a.y": {"a.x"}, "a.z": {"a.x"}}
    assert _cycles(graph) == [["a.x", "a.y"]]
    known = {"publisher.journal.order": Path(), "publisher.journal.store": Path()}
    node = ast.parse("if TYPE_CHECKING:\n    from .store import Journal\n").body[0].body[0]
    assert _targets(node, "publisher.journal.order", False, known) == {"publisher.journal.store"}


@pytest.mark.parametrize("tree", [t.relative_to(ROOT).as_posix() for t, _ in TREES])
def test_no_import_cycle(tree):
    graph = _graph()
    inside = {m for m, p in _modules().items() if p.is_relative_to(ROOT / tree)}
    cycles = [c for c in _cycles(graph) if set(c) & inside]
    assert not cycles, f"import cycles under {tree}: {cycles}"
