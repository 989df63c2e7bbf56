"""Build hook: compiles the hot modules listed in ``src/sessionroute/native.py`` with mypyc.

Everything else about the package is in ``pyproject.toml``. mypyc (https://mypyc.readthedocs.io)
turns the typed modules into C extensions with the same behaviour; it needs a C compiler.
``SESSIONROUTE_PURE_PYTHON=1 pip install ...`` builds nothing (pure Python, about half the
speed of the replica model). The SHA-256 of each compiled source is recorded in
``src/sessionroute/_compiled.json`` so that an edited source is never shadowed by its stale
extension (see ``sessionroute.native.install_guard``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
PACKAGE_DIR = ROOT / "src" / "sessionroute"


def _native() -> Any:
    """``sessionroute.native`` loaded by path (the package's dependencies are not installed
    in the build environment)."""
    spec = importlib.util.spec_from_file_location("_sessionroute_native", PACKAGE_DIR / "native.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot load src/sessionroute/native.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ext_modules() -> list[Any]:
    """The mypyc extensions, or none with ``SESSIONROUTE_PURE_PYTHON=1``."""
    native = _native()
    info = PACKAGE_DIR / native.BUILD_INFO
    if os.environ.get(native.PURE_ENV, "") not in ("", "0"):
        info.unlink(missing_ok=True)
        return []
    import mypy.version
    from mypyc.build import mypycify

    paths = [native._source_path(m, PACKAGE_DIR) for m in native.COMPILED_MODULES]
    sources = {
        m: native.source_digest(p) for m, p in zip(native.COMPILED_MODULES, paths, strict=True)
    }
    info.write_text(
        json.dumps({"compiler": f"mypyc {mypy.version.__version__}", "sources": sources}, indent=1)
        + "\n"
    )
    rel = [str(p.relative_to(ROOT)) for p in paths]
    # The package's dependencies (numpy, pydantic, ...) are not installed in pip's isolated
    # build environment: no config file (pyproject's strict settings would reject the Any
    # types of the missing imports; CI runs `mypy --strict` on everything separately).
    args = ["--config-file=", "--ignore-missing-imports", *rel]
    return list(mypycify(args, opt_level="3"))


class OptionalBuildExt(build_ext):
    """``build_ext`` that installs the pure-Python package, with a warning, when the C compiler
    is missing or fails (same results, about half the speed of the replica model)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # CCompilerError, DistutilsExecError, missing compiler, ...
            native = _native()
            (PACKAGE_DIR / native.BUILD_INFO).unlink(missing_ok=True)  # stale guard: pure
            print(
                f"WARNING: sessionroute: compiling the hot modules failed ({exc}); installing"
                " them as pure Python (same results, about half the speed). Install a C"
                f" compiler (gcc) and reinstall, or set {native.PURE_ENV}=1 to skip the build.",
                flush=True,
            )


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
