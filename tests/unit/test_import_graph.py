"""The library's import graph has no circles: ``libs/infrarsi``, ``services`` and ``bench`` each read as layers.

Every import counts, at module level or inside a function (a lazy import hides a circle, it does not remove
it), ``TYPE_CHECKING`` blocks included. ``from package import name`` depends on ``package.name`` when that is
a module, else on the package itself (its ``__init__``); a package's own ancestors are not a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def modules(base: Path, prefix: str, root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under ``root`` (named as imported from ``base``)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if prefix:
            parts[0] = prefix
        found[".".join(parts)] = path
    return found


def import_graph(mods: Mapping[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in mods)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    edges.add(target if target in mods else base)
        graph[name] = {e for e in edges if e in mods and e != name}
    return graph


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


LAYERS = {
    "libs/infrarsi and services": {
        **modules(ROOT / "libs", "", ROOT / "libs" / "infrarsi"),
        **modules(ROOT, "infrarsi_services", ROOT / "services"),
    },
    "bench": modules(ROOT / "bench", "", ROOT / "bench"),
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_no_import_circles(layer: str) -> None:
    mods = LAYERS[layer]
    assert len(mods) > 10, f"{layer}: found only {len(mods)} modules; the walk is broken"
    assert circles(import_graph(mods)) == []


def test_the_check_finds_a_circle_hidden_in_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def later():\n    from pkg.a import thing\n")
    (pkg / "c.py").write_text("from . import a\n")
    graph = import_graph(modules(tmp_path, "", pkg))
    assert graph["pkg.c"] == {"pkg.a"}
    assert circles(graph) == [["pkg.a", "pkg.b"]]
