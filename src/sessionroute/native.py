"""The compiled replica model and simulator kernel: which modules ``setup.py`` compiles with
mypyc, and the stale-build guard.

The replica model (with its content keys) and the simulator's event kernel
(:data:`COMPILED_MODULES`) are compiled to C
extensions with mypyc (https://mypyc.readthedocs.io, part of mypy) when the package is
installed with a C compiler: the same typed Python, several times as fast. Results are
identical to the pure-Python modules (``tests/test_native.py`` and ``sessionroute bench
digest`` check it). Everything else is plain Python.

An editable install (``pip install -e .``) puts the extensions beside their sources, where Python
imports an extension before a ``.py`` file of the same name. A source edited after the build
would then be ignored silently. :func:`install_guard`, run when :mod:`sessionroute` is
imported, compares each compiled module's source with the SHA-256 recorded at build time
(``_compiled.json``); when any differs, or when ``SESSIONROUTE_PURE_PYTHON=1`` is set, every
compiled module is imported from its source instead, with a warning naming the stale modules.
A build whose C compiler failed records the reason instead, and every run warns until the
package is reinstalled with a compiler (or ``SESSIONROUTE_PURE_PYTHON=1`` is set). Set
``SESSIONROUTE_PURE_PYTHON=1`` at install time to build nothing. An opt-in profile-guided build
(``SESSIONROUTE_PGO=1``, ``setup.py``) is recorded too (:func:`pgo_status`).

This module uses the standard library only: ``setup.py`` loads it by path in the build
environment.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "BUILD_INFO",
    "COMPILED_MODULES",
    "PURE_ENV",
    "SIM_KERNEL",
    "build_caption",
    "build_failure",
    "compiled_modules",
    "install_guard",
    "pgo_status",
    "pure_reason",
    "pure_requested",
    "source_digest",
    "stale_modules",
]

_PACKAGE_DIR = Path(__file__).resolve().parent


def _replica_modules(package_dir: Path) -> list[str]:
    """Every module of the ``sessionroute.replica`` package (its ``__init__`` aside)."""
    return sorted(
        f"sessionroute.replica.{path.stem}"
        for path in (package_dir / "replica").glob("*.py")
        if path.stem != "__init__"
    )


SIM_KERNEL: tuple[str, ...] = (
    "sessionroute.sim.dispatch",
    "sessionroute.sim.events",
    "sessionroute.sim.inflight",
    "sessionroute.sim.simulation",
    "sessionroute.sim.wakeups",
)
"""The simulator's event kernel: the event queue and its loop, replica wake-ups, and a turn's
path through them (submit, placement, arrival, finish, delivery). Every request passes through
these a handful of times; compiled, ``bench sim`` runs faster (docs/benchmarks.md)."""

COMPILED_MODULES: tuple[str, ...] = (
    "sessionroute.keys",
    "sessionroute.minheap",
    *_replica_modules(_PACKAGE_DIR),
    *SIM_KERNEL,
)
"""Modules compiled with mypyc, as one group: the replica model (every module of
``sessionroute.replica``, the ideal fleet-wide prefix cache of the hit-rate bound included), its
content keys (:mod:`sessionroute.keys`: the 64-bit mix and the
block chain of segments), the binary heap it uses (:mod:`sessionroute.minheap`) and the
simulator's event kernel (:data:`SIM_KERNEL`). Everything else (router, policies, workloads,
the rest of the simulator, experiments) is plain Python: edit it and run it, no rebuild."""

BUILD_INFO = "_compiled.json"
"""File the build writes beside the extensions (the package folder of its output):
``{"compiler": ..., "sources": {module: sha256}, "pgo": ...}``, or ``{"failed": reason}`` when
compiling failed. ``pgo`` is ``"on"`` for a profile-guided build (GCC >= 10, ``setup.py``),
``"off"``, or ``"failed: <why>"`` (the library was then built without it)."""

PURE_ENV = "SESSIONROUTE_PURE_PYTHON"
"""Environment variable: ``1`` builds nothing at install and imports sources at run time."""


def _source_path(module: str, package_dir: Path = _PACKAGE_DIR) -> Path:
    """The ``.py`` file of ``module`` (a dotted name under ``sessionroute``)."""
    parts = module.split(".")[1:]
    return package_dir.joinpath(*parts[:-1], parts[-1] + ".py")


def _has_extension(module: str, package_dir: Path = _PACKAGE_DIR) -> bool:
    """Whether a compiled extension of ``module`` sits beside its source."""
    src = _source_path(module, package_dir)
    return any(
        src.with_name(src.stem + suffix).is_file()
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


def pure_requested() -> bool:
    """Whether ``SESSIONROUTE_PURE_PYTHON`` asks for pure Python (set, and not ``0``)."""
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def source_digest(path: Path) -> str:
    """SHA-256 (hex) of a source file's bytes.

    Raises:
        OSError: if the file cannot be read.
    """
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _record(package_dir: Path) -> dict[str, Any]:
    """The build record (empty when there is none or it is unreadable)."""
    try:
        info = json.loads((package_dir / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _recorded(package_dir: Path) -> dict[str, str]:
    """Source digests recorded at build time (empty when there is no readable record)."""
    sources = _record(package_dir).get("sources")
    return {str(k): str(v) for k, v in sources.items()} if isinstance(sources, dict) else {}


def build_failure(package_dir: Path = _PACKAGE_DIR) -> str | None:
    """Why the install did not compile the hot modules (a short reason), or None when it did
    not try to or succeeded."""
    failed = _record(package_dir).get("failed")
    return str(failed) if failed else None


def stale_modules(package_dir: Path = _PACKAGE_DIR) -> list[str]:
    """Compiled modules whose extension would be imported but whose source changed since the
    build (or was never recorded): those Python must not import from the extension."""
    recorded = _recorded(package_dir)
    stale = []
    for module in COMPILED_MODULES:
        if not _has_extension(module, package_dir):
            continue
        src = _source_path(module, package_dir)
        if not src.is_file() or recorded.get(module) != source_digest(src):
            stale.append(module)
    return stale


def compiled_modules() -> list[str]:
    """Modules of :data:`COMPILED_MODULES` that are imported from a compiled extension now."""
    out = []
    for module in COMPILED_MODULES:
        mod = sys.modules.get(module)
        if mod is None:
            spec = importlib.util.find_spec(module)
            origin = spec.origin if spec is not None else None
        else:
            origin = getattr(mod, "__file__", None)
        if origin is not None and not origin.endswith(".py"):
            out.append(module)
    return out


_SPEED = "about 1/4 of the replica model's compiled speed, 2/5 of the simulator's"


def pure_reason(package_dir: Path = _PACKAGE_DIR) -> str:
    """Why the hot modules run as pure Python (for messages; meaningful when they do)."""
    if pure_requested():
        return f"{PURE_ENV} is set"
    failed = build_failure(package_dir)
    if failed:
        return f"compiling failed at install: {failed}"
    stale = stale_modules(package_dir)
    if stale:
        return f"the source of {', '.join(stale)} changed since the build: reinstall"
    return "installed without compiling"


def pgo_status(package_dir: Path = _PACKAGE_DIR) -> str:
    """How the compiled modules' library was built: ``"on"`` (profile-guided), ``"off"``, or why
    the profile-guided build's training run failed (``"unknown"`` without a build record)."""
    return str(_record(package_dir).get("pgo", "unknown"))


def build_caption(compiled: bool) -> str:
    """One line for benchmark tables: which build of the hot modules ran, and why."""
    if compiled:
        pgo = pgo_status()
        how = "profile-guided" if pgo == "on" else f"PGO {pgo}"
        return f"hot modules compiled with mypyc, {how} (sessionroute.native)"
    return f"hot modules as pure Python ({pure_reason()}): {_SPEED}"


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the listed modules' ``.py`` sources ahead of their compiled extensions."""

    def __init__(self, modules: Sequence[str], package_dir: Path) -> None:
        self.modules = frozenset(modules)
        self.package_dir = package_dir

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        return importlib.util.spec_from_file_location(
            fullname, _source_path(fullname, self.package_dir)
        )


def install_guard(package_dir: Path = _PACKAGE_DIR) -> bool:
    """Import every compiled module from source when ``SESSIONROUTE_PURE_PYTHON=1`` or when
    one of them is stale (warning with their names). Must run before any of them is imported.

    Returns:
        True when the sources will be imported, False when the compiled extensions will.
    """
    if pure_requested():
        use_source = True
    else:
        failed = build_failure(package_dir)
        stale = stale_modules(package_dir)
        if failed:
            _warn(
                f"the hot modules were not compiled at install ({failed}): running pure Python"
                f" (same results, {_SPEED}). Install a C compiler (gcc) and reinstall, or set"
                f" {PURE_ENV}=1 to silence this."
            )
        elif stale:
            _warn(
                f"the source of compiled modules changed since the build ({', '.join(stale)}):"
                f" running all compiled modules as pure Python (same results, {_SPEED})."
                " Rebuild with `pip install -e .`."
            )
        use_source = bool(stale)
    if use_source and not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFinder(COMPILED_MODULES, package_dir))
    return use_source


def _warn(message: str) -> None:
    """A RuntimeWarning attributed to the package rather than to a line of whoever imported it."""
    warnings.warn_explicit(f"sessionroute: {message}", RuntimeWarning, "sessionroute", 0)
