"""Imports between sessionroute's packages follow DESIGN.md's layer picture, with no cycle.

The graph is built with :mod:`ast` from every ``import`` in ``src/sessionroute`` (also those
inside functions and under ``TYPE_CHECKING``: a lazy import is still a dependency). A node is
a package directory (``router.policies``, ``experiments.live``) or a top-level module
(``types``); an import of ``sessionroute.a.b.c`` counts for the package that holds the module.

- The package graph is acyclic, once the edges of :data:`KNOWN_CYCLE_EDGES` (each of which
  must still exist) are left out.
- Every import between top-level packages points down :data:`LAYERS`, except the deviations
  in :data:`KNOWN_DEVIATIONS` (each of which must still exist, so a fix removes its entry).
- ``experiments/`` (``live/`` included) uses the simulator only through the names
  ``sessionroute.sim`` exports, never its modules.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import sessionroute

ROOT = Path(sessionroute.__file__).parent

LAYERS: dict[str, int] = {
    # leaf modules: they import nothing of sessionroute
    "types": 0,
    "clock": 0,
    "errors": 0,
    "minheap": 0,
    "keys": 0,
    "native": 0,
    # the package itself (re-exports the leaf modules' names)
    "": 1,
    # sans-I/O cores: routing, the replica model, workloads; what an arm measured
    "router": 2,
    "replica": 2,
    "workloads": 2,
    "record": 2,
    # drivers: virtual time, HTTP in front of workers, replicas over HTTP, the client side
    "sim": 3,
    "serve": 3,
    "emulate": 3,
    "client": 3,
    "calibrate": 3,  # probes real vLLM servers over HTTP, fits replica profiles
    "experiments": 4,
    "bench": 5,
    "cli": 6,
}
"""Rank of each top-level package or module: an import must point to a lower rank."""

KNOWN_DEVIATIONS: dict[tuple[str, str], str] = {}
"""Imports between packages of one rank (or upwards) that exist today, with the reason."""

KNOWN_CYCLE_EDGES: dict[tuple[str, str], str] = {}
"""Package edges that close a cycle today, with the reason; left out of the cycle check."""


def _modules() -> dict[str, Path]:
    """Dotted name (without ``sessionroute.``; ``""`` for the package) -> file."""
    out: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()
PACKAGES = {name for name, path in MODULES.items() if path.name == "__init__.py"}


def node(module: str) -> str:
    """The graph node of a module: its package, or itself for a top-level module."""
    if module in PACKAGES or "." not in module:
        return module
    return module.rsplit(".", 1)[0]


def _resolve(dotted: str) -> str | None:
    """The longest known module or package that ``sessionroute.<dotted>`` names."""
    parts = dotted.split(".")
    while parts:
        name = ".".join(parts)
        if name in MODULES:
            return name
        parts.pop()
    return None


def _imports(path: Path) -> set[str]:
    """Modules of sessionroute (dotted, without the prefix) that ``path`` imports."""
    found: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text("utf-8"))):
        targets: list[str] = []
        if isinstance(n, ast.Import):
            targets = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            # ``from sessionroute.x import y``: y may be a submodule
            targets = [f"{n.module}.{a.name}" for a in n.names] or [n.module]
        for t in targets:
            if t == "sessionroute" or t.startswith("sessionroute."):
                resolved = _resolve(t.removeprefix("sessionroute").lstrip("."))
                if resolved is not None:
                    found.add(resolved)
    return found


def graph() -> dict[str, dict[str, set[str]]]:
    """node -> imported node -> the importing modules (edges within one node left out)."""
    edges: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for module, path in MODULES.items():
        src = node(module)
        for target in _imports(path):
            dst = node(target)
            if dst != src:
                edges[src][dst].add(module or "sessionroute")
    return edges


def _cycle(edges: dict[str, dict[str, set[str]]]) -> list[str] | None:
    """One cycle of the graph as a node path, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, {})):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state and (found := visit(m)) is not None:
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state and (found := visit(n)) is not None:
            return found
    return None


def top(n: str) -> str:
    return n.split(".", 1)[0]


def test_the_graph_sees_the_packages() -> None:
    edges = graph()
    assert "experiments.live" in edges  # a subpackage is a node of its own
    assert "experiments" in edges["experiments.live"]
    assert "record" in edges["sim"] and "record" in edges["experiments.live"]
    assert set(map(top, MODULES)) - {""} <= set(LAYERS), "a new top-level package needs a rank"


def test_no_import_cycle_between_packages() -> None:
    edges = graph()
    for src, dst in KNOWN_CYCLE_EDGES:
        assert dst in edges[src], f"known cycle edge {src} -> {dst} is gone: remove its entry"
        del edges[src][dst]
    cycle = _cycle(edges)
    assert cycle is None, " -> ".join(cycle or ())


def test_the_cycle_finder_finds_one() -> None:
    edges: dict[str, dict[str, set[str]]] = {"a": {"b": {"a.x"}}, "b": {"c": {"b.y"}}}
    assert _cycle(edges) is None
    edges["c"] = {"b": {"c.z"}}
    assert _cycle(edges) == ["b", "c", "b"]


def test_imports_point_down_the_layers() -> None:
    bad: list[str] = []
    seen: set[tuple[str, str]] = set()
    for src, targets in graph().items():
        for dst, importers in targets.items():
            a, b = top(src), top(dst)
            if a == b:
                continue
            if LAYERS[b] < LAYERS[a]:
                continue
            seen.add((a, b))
            if (a, b) not in KNOWN_DEVIATIONS:
                bad.append(
                    f"{a} (rank {LAYERS[a]}) imports {b} (rank {LAYERS[b]}): {sorted(importers)}"
                )
    assert not bad, "\n".join(bad)
    assert seen == set(KNOWN_DEVIATIONS), "a known deviation is gone: remove its entry"


def test_experiments_use_only_the_simulators_public_names() -> None:
    import sessionroute.sim

    public = set(sessionroute.sim.__all__)
    bad: list[str] = []
    for module, path in MODULES.items():
        if top(module) != "experiments":
            continue
        for n in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names if a.name.startswith("sessionroute.sim.")]
                bad += [f"{module}: import {x}" for x in names]
            elif (
                isinstance(n, ast.ImportFrom)
                and n.module
                and n.module.startswith("sessionroute.sim")
            ):
                if n.module != "sessionroute.sim":
                    bad.append(f"{module}: from {n.module} import ...")
                bad += [
                    f"{module}: sim.{a.name} is not public" for a in n.names if a.name not in public
                ]
    assert not bad, "\n".join(bad)
