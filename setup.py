"""Build hook: compiles the hot modules listed in ``src/sessionroute/native.py`` with mypyc.

Everything else about the package is in ``pyproject.toml``. mypyc (https://mypyc.readthedocs.io)
turns the typed modules into C extensions with the same behaviour; it needs a C compiler.
``SESSIONROUTE_PURE_PYTHON=1 pip install ...`` builds nothing (pure Python: about a third of
the replica model's compiled speed). The SHA-256 of each compiled source is recorded in
``_compiled.json`` beside the extensions so that an edited source is never shadowed by its
stale extension (see ``sessionroute.native.install_guard``).
"""

from __future__ import annotations

import importlib.util
import json
import re
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


NATIVE = _native()
PATHS = [NATIVE._source_path(m, PACKAGE_DIR) for m in NATIVE.COMPILED_MODULES]
SOURCES: dict[str, str] = {}
"""SHA-256 of each compiled module's source, taken when mypyc reads the sources."""


def ext_modules() -> list[Any]:
    """The mypyc extensions, or none with ``SESSIONROUTE_PURE_PYTHON=1``."""
    if NATIVE.pure_requested():
        return []
    from mypyc.build import mypycify

    for module, path in zip(NATIVE.COMPILED_MODULES, PATHS, strict=True):
        SOURCES[module] = NATIVE.source_digest(path)
    rel = [str(p.relative_to(ROOT)) for p in PATHS]
    # The package's dependencies (numpy, pydantic, ...) are not installed in pip's isolated
    # build environment: no config file (pyproject's strict settings would reject the Any
    # types of the missing imports; CI runs `mypy --strict` on everything separately).
    args = ["--config-file=", "--ignore-missing-imports", *rel]
    return list(mypycify(args, opt_level="3"))


def _short_reason(exc: Exception) -> str:
    """One short line for a failed compile: the compiler and its exit status when the error
    quotes a whole command line, else the error's first line."""
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    quoted = re.match(r"[Cc]ommand '\[?'?([^',\]]+)'?.*?((?:returned|failed with) .*)", text)
    if quoted:
        return f"C compiler {quoted.group(1)!r} {quoted.group(2).rstrip('.')}"
    return text[:160]


class RecordingBuildExt(build_ext):
    """``build_ext`` that writes the build record (``sessionroute.native.BUILD_INFO``) beside
    the extensions, in its own output only: the package folder of ``build_lib``, or of the
    source tree for an in-place (editable) build. When the C compiler is missing or fails the
    package stays pure Python and the record says why (``sessionroute`` then warns at run
    time, since pip hides build output)."""

    def run(self) -> None:
        if not self.extensions:
            super().run()
            return
        record = Path(self.get_ext_fullpath("sessionroute.native")).parent / NATIVE.BUILD_INFO
        try:
            super().run()
        except Exception as exc:  # CCompilerError, DistutilsExecError, missing compiler, ...
            reason = _short_reason(exc)
            info: dict[str, Any] = {"failed": reason}
            print(
                f"WARNING: sessionroute: compiling the hot modules failed ({reason}); they stay"
                " pure Python (same results, slower). Install a C compiler (gcc) and reinstall,"
                f" or set {NATIVE.PURE_ENV}=1 to skip the build.",
                flush=True,
            )
        else:
            import mypy.version

            info = {"compiler": f"mypyc {mypy.version.__version__}", "sources": SOURCES}
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(info, indent=1) + "\n")


setup(ext_modules=ext_modules(), cmdclass={"build_ext": RecordingBuildExt})
