"""No import cycle inside the `bertforge` package, counting function-local imports too.

A cycle through a function-local import still ties the two modules together (each needs the other to
work) and breaks the day someone hoists the import; the rule (DESIGN §5, issue "One training step, one owner
per concept") is no circle at all. The graph is read from the source with `ast`, so the test imports
nothing: `from bertforge.a import b` is an edge to the module `bertforge.a.b` when that file exists, else to
`bertforge.a`; a package's `__init__` counts as the module of the package, and importing a module runs the
`__init__` of each package above it that the importer is not already inside.
"""

from __future__ import annotations

import ast
from pathlib import Path

import bertforge

ROOT = Path(bertforge.__file__).parent


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(name: str, modules: set[str]) -> str | None:
    """The package module that `import name` runs last: the longest known prefix of `name`."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the bertforge modules it imports anywhere in its body (top level or inside functions)."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets.update(_resolve(a.name, modules) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: up from this module's package
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:  # `from pkg import sub` imports the submodule when there is one
                    targets.add(
                        _resolve(f"{base}.{a.name}", modules)
                        if f"{base}.{a.name}" in modules
                        else _resolve(base, modules)
                    )
        graph[mod] = {a for t in targets if t for a in _with_packages(t, mod) if a != mod}
    return graph


def _with_packages(target: str, importer: str) -> list[str]:
    """`target` and the packages whose `__init__` importing it runs (those not already above `importer`)."""
    parts = target.split(".")
    chain = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]  # bertforge, bertforge.x, ...
    return [m for m in chain if m == target or not importer.startswith(m + ".")]


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan), as a path a -> ... -> a."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(comp, graph) for comp in components]


def _cycle_in(comp: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself (breadth-first)."""
    start = min(comp)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:  # closed: walk the parents back from v
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{sorted(comp)} is not strongly connected")


def test_no_import_cycle_in_the_package():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_graph_sees_local_relative_and_package_imports(tmp_path):
    pkg = tmp_path / "bertforge"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from bertforge.sub.b import B\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from . import b\n")  # function-local, relative
    (pkg / "sub" / "b.py").write_text("from bertforge.sub.a import f\nB = 1\n")
    (pkg / "c.py").write_text("import bertforge.sub.a\n")
    (pkg / "d.py").write_text("from bertforge.sub import B\nfrom bertforge import c\n")
    graph = import_graph(pkg)
    assert graph["bertforge.sub.a"] == {"bertforge.sub.b"}
    assert graph["bertforge.c"] == {"bertforge.sub", "bertforge.sub.a"}  # the package __init__ runs first
    assert graph["bertforge.d"] == {"bertforge.sub", "bertforge.c"}
    assert find_cycles(graph) == [["bertforge.sub.a", "bertforge.sub.b", "bertforge.sub.a"]]
