"""The product and the harness have no import cycle, counting imports made only for type checking
or inside functions: a cycle is where a newcomer cannot tell which part builds on which.

The graph is read from the source (ast), so it sees imports that no test happens to execute.
"""

from __future__ import annotations

import ast
import re
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


# The rooms from the bottom up, and what each may import besides itself: an import may only point
# down this list. docs/design.md's Layout lists the same rooms top down. The contract both programs
# share is cni_plugin.wire and cni_plugin.lean; the plugin's own modules (cni_plugin) are the
# plugin's business, except the two the chain keeper needs to write and retire the plugin's entry
# by the plugin's own rules (PLUGIN_MODULES_FOR_KEEPER).
GROUND = {"publisher.limits", "publisher.clock", "publisher.logs", "publisher.nodelock", "publisher.clioptions"}
CONTRACT = {"cni_plugin.lean", "cni_plugin.wire"}
ROOMS: list[tuple[str, set[str]]] = [
    ("cni_plugin.lean", set()),
    ("cni_plugin.wire", {"cni_plugin.lean"}),
    ("cni_plugin", CONTRACT),
    ("publisher.limits", set()),
    ("publisher.clock", set()),
    ("publisher.logs", set()),
    ("publisher.nodelock", set()),
    ("publisher.clioptions", set()),
    ("publisher.kube", GROUND),
    ("publisher.nsopen", GROUND | {"cni_plugin.lean"}),
    ("publisher.observe", GROUND | CONTRACT | {"publisher.kube"}),
    ("publisher.journal", GROUND | CONTRACT),
    ("publisher.intake", GROUND | CONTRACT | {"publisher.journal", "publisher.observe"}),
    ("publisher.live", GROUND | CONTRACT | {"publisher.journal", "publisher.nsopen", "publisher.observe"}),
    ("publisher.reconcile", GROUND | CONTRACT | {"publisher.kube", "publisher.observe", "publisher.journal",
                                                 "publisher.live"}),
    ("publisher.repair", GROUND | CONTRACT | {"publisher.kube", "publisher.observe", "publisher.journal",
                                              "publisher.intake", "publisher.reconcile"}),
    ("publisher.service", GROUND | CONTRACT | {"publisher.kube", "publisher.nsopen", "publisher.observe",
                                               "publisher.journal", "publisher.intake", "publisher.live",
                                               "publisher.reconcile", "publisher.repair"}),
    ("publisher.keeper", GROUND | CONTRACT | {"cni_plugin", "publisher.kube", "publisher.observe"}),
    ("publisher.endpoints", GROUND | {"publisher.kube", "publisher.observe", "publisher.reconcile"}),
    ("publisher.cli", GROUND | CONTRACT | {"publisher.kube", "publisher.nsopen", "publisher.observe",
                                           "publisher.journal", "publisher.intake", "publisher.live",
                                           "publisher.reconcile", "publisher.repair", "publisher.service",
                                           "publisher.keeper", "publisher.endpoints"}),
]
PLUGIN_MODULES_FOR_KEEPER = {"cni_plugin.config", "cni_plugin.retire"}


def _room(module: str) -> str | None:
    """The room a product module lives in: the deepest room name that is the module or its package."""
    names = {name for name, _ in ROOMS}
    while module and module not in names:
        module = module.rpartition(".")[0]
    return module or None


def _violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that leaves its room for one the table does not allow (or a plugin module the keeper may not use)."""
    allowed = dict(ROOMS)
    found = []
    for module, deps in sorted(graph.items()):
        here = _room(module)
        if here is None:
            continue
        for dep in sorted(deps):
            there = _room(dep)
            if there is None or there == here:
                continue
            if there not in allowed[here]:
                found.append(f"{module} -> {dep} ({here} may not import {there})")
            elif there == "cni_plugin" and here == "publisher.keeper" and dep not in PLUGIN_MODULES_FOR_KEEPER:
                found.append(f"{module} -> {dep} (the keeper may use only {sorted(PLUGIN_MODULES_FOR_KEEPER)})")
    return found


def test_the_table_catches_a_planted_wrong_import():
    # the control: a journal module importing the service, and the keeper importing the plugin's hand-off
    graph = {"publisher.journal.store": {"publisher.service", "publisher.clock"},
             "publisher.keeper.keeper": {"cni_plugin.handoff", "cni_plugin.retire"}}
    assert _violations(graph) == [
        "publisher.journal.store -> publisher.service (publisher.journal may not import publisher.service)",
        "publisher.keeper.keeper -> cni_plugin.handoff (the keeper may use only "
        "['cni_plugin.config', 'cni_plugin.retire'])"]


def test_imports_only_point_down_the_table_of_rooms():
    assert not _violations(_graph()), "\n".join(_violations(_graph()))


def test_every_product_package_is_a_room_of_the_table():
    names = [name for name, _ in ROOMS]
    rooms = {_module_name(p.parent, ROOT) for tree in ("cni_plugin", "publisher")
             for p in (ROOT / tree).rglob("__init__.py")}
    rooms |= {_module_name(p, ROOT) for p in (ROOT / "publisher").glob("*.py") if p.name != "__init__.py"}
    missing = sorted(r for r in rooms if r not in names and r != "publisher")
    assert not missing, f"packages or top modules with no row in ROOMS: {missing}"
    for index, (name, allowed) in enumerate(ROOMS):  # the table itself only points down
        assert allowed <= set(names[:index]), f"{name} may import a room above it: {allowed - set(names[:index])}"


def _layout_rooms() -> list[str]:
    """The rooms docs/design.md's Layout names, top down: each package, then its indented entries."""
    text = (ROOT / "docs" / "design.md").read_text()
    layout = text.split("## Layout", 1)[1].split("```", 2)[1]
    listed, package = [], ""
    for line in layout.splitlines():
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0] if line.strip() else ""
        if not line.startswith(" "):
            package = names.rstrip("/")
            listed.append(package)
            continue
        for name in names.split(", "):
            if name.endswith("/") or name.endswith(".py"):
                listed.append(f"{package}.{name.rstrip('/').removesuffix('.py')}")
    return listed


def test_the_design_layout_lists_the_rooms_in_the_tables_order():
    listed = _layout_rooms()
    for package in ("cni_plugin", "publisher"):
        table = [name for name, _ in reversed(ROOMS) if name == package or name.startswith(package + ".")]
        if package == "publisher":
            table = [name for name in table if name != "publisher"]
        shown = [name for name in listed if name in table]
        assert shown == table, f"docs/design.md Layout lists {shown}; the table, top down: {table}"
