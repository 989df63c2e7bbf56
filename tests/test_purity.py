"""The pure packages never touch I/O, the wall clock or global randomness (DESIGN.md).

Scans every module of ``sessionroute.{router,replica,record,sim,workloads}`` with :mod:`ast`
and fails on: importing ``asyncio``, ``aiohttp``, ``httpx``, ``time`` or ``threading``; calling
or importing a module-level function of :mod:`random` (``random.Random`` as a type or seeded
constructor is fine); ``datetime.now/utcnow/today``; numpy's global generator
(``np.random.rand`` and friends; ``np.random.default_rng(seed)`` and ``Generator`` are fine).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sessionroute

PURE_PACKAGES = ("router", "replica", "record", "sim", "workloads")
BANNED_MODULES = frozenset({"asyncio", "aiohttp", "httpx", "time", "threading"})
RANDOM_ALLOWED = frozenset({"Random"})
NUMPY_RANDOM_ALLOWED = frozenset(
    {
        "Generator",
        "default_rng",
        "SeedSequence",
        "BitGenerator",
        "PCG64",
        "PCG64DXSM",
        "Philox",
        "SFC64",
        "MT19937",
    }
)
CLOCK_ATTRS = frozenset({"now", "utcnow", "today"})
ROOT = Path(sessionroute.__file__).parent


def pure_modules() -> list[Path]:
    """Every ``.py`` file under the pure packages (recursively)."""
    return sorted(p for pkg in PURE_PACKAGES for p in (ROOT / pkg).rglob("*.py"))


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.random_names: set[str] = set()  # local names bound to the random module
        self.numpy_names: set[str] = set()  # local names bound to numpy
        self.np_random_names: set[str] = set()  # local names bound to numpy.random
        self.datetime_names: set[str] = {"datetime", "date"}

    def _bad(self, node: ast.AST, what: str) -> None:
        self.problems.append(f"line {getattr(node, 'lineno', '?')}: {what}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]
            local = alias.asname or top
            if top in BANNED_MODULES:
                self._bad(node, f"import {alias.name}")
            elif alias.name == "random":
                self.random_names.add(local)
            elif alias.name == "numpy":
                self.numpy_names.add(local)
            elif alias.name == "numpy.random":
                if alias.asname:
                    self.np_random_names.add(alias.asname)
                else:
                    self.numpy_names.add("numpy")
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        top = module.split(".")[0]
        names = [a.name for a in node.names]
        if node.level == 0 and top in BANNED_MODULES:
            self._bad(node, f"from {module} import {', '.join(names)}")
        elif node.level == 0 and module == "random":
            for n in names:
                if n not in RANDOM_ALLOWED:
                    self._bad(node, f"from random import {n} (global random state)")
        elif node.level == 0 and module == "numpy.random":
            for n in names:
                if n not in NUMPY_RANDOM_ALLOWED:
                    self._bad(node, f"from numpy.random import {n} (global generator)")
        elif node.level == 0 and module == "numpy":
            for a in node.names:
                if a.name == "random":
                    self.np_random_names.add(a.asname or "random")
        elif node.level == 0 and module == "datetime":
            for a in node.names:
                self.datetime_names.add(a.asname or a.name)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base = node.value
        if isinstance(base, ast.Name):
            if base.id in self.random_names and node.attr not in RANDOM_ALLOWED:
                self._bad(node, f"{base.id}.{node.attr} (global random state)")
            if base.id in self.np_random_names and node.attr not in NUMPY_RANDOM_ALLOWED:
                self._bad(node, f"{base.id}.{node.attr} (numpy global generator)")
            if base.id in self.datetime_names and node.attr in CLOCK_ATTRS:
                self._bad(node, f"{base.id}.{node.attr} (wall clock)")
        elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
            if (
                base.value.id in self.numpy_names
                and base.attr == "random"
                and node.attr not in NUMPY_RANDOM_ALLOWED
            ):
                self._bad(node, f"{base.value.id}.random.{node.attr} (numpy global generator)")
            if base.attr in ("datetime", "date") and node.attr in CLOCK_ATTRS:
                self._bad(node, f"{base.value.id}.{base.attr}.{node.attr} (wall clock)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if (
            not node.args
            and not node.keywords
            and isinstance(f, ast.Attribute)
            and f.attr == "default_rng"
        ):
            self._bad(node, "default_rng() without a seed")
        self.generic_visit(node)


def impurities(source: str) -> list[str]:
    """Problems found in one module's source (empty when it is pure)."""
    checker = _Checker()
    checker.visit(ast.parse(source))
    return checker.problems


def test_the_scan_covers_the_pure_packages() -> None:
    files = pure_modules()
    found = {p.relative_to(ROOT).parts[:2] for p in files}
    assert {("router", "policies"), ("router", "state"), ("replica", "core.py")} <= found
    assert ROOT / "router" / "policies" / "consistent_hash_bounded_load.py" in files


@pytest.mark.parametrize("path", pure_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module(path: Path) -> None:
    assert impurities(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "source",
    [
        "import time",
        "import asyncio.tasks",
        "from aiohttp import web",
        "import httpx as h",
        "from threading import Lock",
        "from time import monotonic",
        "import random\nrandom.random()",
        "import random as r\nx = r.choice([1])",
        "from random import shuffle",
        "from datetime import datetime\ndatetime.now()",
        "import datetime\ndatetime.datetime.utcnow()",
        "import numpy as np\nnp.random.rand(3)",
        "from numpy import random as npr\nnpr.shuffle([1])",
        "import numpy as np\nnp.random.default_rng()",
    ],
)
def test_the_checker_catches(source: str) -> None:
    assert impurities(source) != []


@pytest.mark.parametrize(
    "source",
    [
        "import random\nrng: random.Random = random.Random(3)",
        "from random import Random\nRandom(1).random()",
        "import numpy as np\ng = np.random.default_rng(7)\ng.random()",
        "from numpy.random import Generator, PCG64",
        "from sessionroute.clock import Clock",
        "import datetime\nd = datetime.timedelta(seconds=1)",
    ],
)
def test_the_checker_allows(source: str) -> None:
    assert impurities(source) == []
