"""The package layers, read from the source: every import (module level or inside a function)
points down, and no two modules import each other, directly or through others.

    schemas <- infra <- proxy | pipeline | trainer | orchestrator <- openforge <- bench, tests
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYER = {
    "schemas": 0,
    "infra": 1,
    "proxy": 2,
    "pipeline": 2,
    "trainer": 2,
    "orchestrator": 2,
    "openforge": 3,
    "bench": 4,
    "tests": 5,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for top in LAYER:
        for path in sorted((ROOT / top).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, imported module of ours) for every import statement in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield node.lineno, sub if sub in known else base


def _graph() -> dict[str, list[tuple[int, str]]]:
    known = _modules()
    return {
        name: [(line, mod) for line, mod in _imports(name, path, known) if mod in known]
        for name, path in known.items()
    }


def test_every_import_points_down() -> None:
    known = _modules()
    bad = []
    for name, edges in _graph().items():
        here = name.split(".")[0]
        for line, mod in edges:
            there = mod.split(".")[0]
            if there == here:
                continue
            if LAYER[there] >= LAYER[here]:
                bad.append(f"{known[name].relative_to(ROOT)}:{line}: {here} imports {mod}")
    assert not bad, "imports that point up or sideways:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    graph = {
        name: sorted({mod for _, mod in edges if mod != name}) for name, edges in _graph().items()
    }
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []
    cycles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    src = tmp_path / "mod.py"
    src.write_text("def f():\n    from infra.eventlog import kafka\n\nfrom . import sibling\n")
    known = {"infra.eventlog.kafka": src, "pkg.sibling": src}
    found = list(_imports("pkg.mod", src, known))
    assert (2, "infra.eventlog.kafka") in found
    assert (4, "pkg.sibling") in found
