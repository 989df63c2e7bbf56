"""Build hook: compiles the replica model and the simulator's event kernel (the modules listed
in ``src/sessionroute/native.py``) with mypyc.

Everything else about the package is in ``pyproject.toml``. mypyc (https://mypyc.readthedocs.io)
turns the typed modules into C extensions with the same behaviour; it needs a C compiler. Without
one, or when mypyc or the compiler fails, the package installs as pure Python (same results,
slower) and a message says why; ``SESSIONROUTE_PURE_PYTHON=1 pip install ...`` builds nothing.
The SHA-256 of each compiled source is recorded in ``_compiled.json`` beside the extensions so
that an edited source is never shadowed by its stale extension (see
``sessionroute.native.install_guard``).

Profile-guided optimization is an explicit opt-in, never part of a default install:
``SESSIONROUTE_PGO=1 pip install --no-build-isolation -e .`` in a venv that already has the
package's dependencies (a first plain install) builds the library with ``-fprofile-generate``,
runs a short simulation on it (:data:`TRAINING`, which needs numpy and pydantic from that venv),
and builds it again with ``-fprofile-use`` (GCC >= 10 only; docs/benchmarks.md has the numbers).
If any PGO step fails, everything is built plainly and the build record says why (``"pgo"``).
With GCC the library is compiled with ``-fno-semantic-interposition`` (direct, inlinable calls
between its own functions).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
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
    """The mypyc extensions; none with ``SESSIONROUTE_PURE_PYTHON=1``, or (with a printed
    warning) when mypyc is missing or fails: the package is then pure Python."""
    if NATIVE.pure_requested():
        return []
    for module, path in zip(NATIVE.COMPILED_MODULES, PATHS, strict=True):
        SOURCES[module] = NATIVE.source_digest(path)
    rel = [str(p.relative_to(ROOT)) for p in PATHS]
    # The package's dependencies (numpy, pydantic, ...) are not installed in pip's isolated
    # build environment: no config file (pyproject's strict settings would reject the Any
    # types of the missing imports; CI runs `mypy --strict` on everything separately).
    args = ["--config-file=", "--ignore-missing-imports", *rel]
    try:
        from mypyc.build import mypycify

        return list(mypycify(args, opt_level="3"))
    except (Exception, SystemExit) as exc:  # mypyc reports type errors by exiting
        _warn_pure(f"mypyc failed: {_short_reason(exc) if isinstance(exc, Exception) else exc}")
        return []


def _warn_pure(reason: str) -> None:
    """Say (in the build output) that the replica model stays pure Python, and why."""
    print(
        f"WARNING: sessionroute: compiling the replica model failed ({reason}); it stays pure"
        " Python (same results, slower). Install a C compiler (gcc) and reinstall, or set"
        f" {NATIVE.PURE_ENV}=1 to skip the build.",
        flush=True,
    )


def _short_reason(exc: Exception) -> str:
    """One short line for a failed compile: the compiler and its exit status when the error
    quotes a whole command line, else the error's first line."""
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    quoted = re.match(r"[Cc]ommand '\[?'?([^',\]]+)'?.*?((?:returned|failed with) .*)", text)
    if quoted:
        return f"C compiler {quoted.group(1)!r} {quoted.group(2).rstrip('.')}"
    return text[:160]


PGO_ENV = "SESSIONROUTE_PGO"
"""Set to ``1`` to build the library profile-guided (see the module docstring)."""
TRAINING = """
from sessionroute.clock import ManualClock
from sessionroute.native import compiled_modules
from sessionroute.sim import SimSpec, run_simulation
assert compiled_modules(), "the training run would not use the compiled modules"
for policy, steps in (("sticky_least_loaded", 3), ("consistent_hash", 1)):
    spec = SimSpec.model_validate({"workload": {"kind": "swe-rl", "steps": steps}})
    run_simulation(spec, policy, seed=0, wall_clock=ManualClock())
"""
"""The PGO training run: the default ``swe-rl`` workload (what ``bench sim`` runs) under two
policies; code it does not reach is optimized as usual (``-fprofile-partial-training``)."""
_PGO_GENERATE = ["-fprofile-generate", "-fprofile-update=single"]
_PGO_USE = ["-fprofile-use", "-fprofile-partial-training", "-Wno-missing-profile"]


def _is_gcc(command: list[str]) -> bool:
    """Whether a compiler command (``compiler_so``, wrappers such as ccache included) is GCC 10
    or newer: it predefines ``__GNUC__ >= 10`` and not ``__clang__`` (the PGO flags are GCC's;
    ``-fprofile-partial-training`` needs GCC 10)."""
    if not command:  # MSVC has no compiler_so
        return False
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.c"
        probe.write_text("int x;\n")
        try:
            out = subprocess.run(
                [*command, "-dM", "-E", str(probe)],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return False
    match = re.search(r"#define __GNUC__ (\d+)", out)
    return match is not None and int(match.group(1)) >= 10 and "__clang__" not in out


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
            _warn_pure(reason)
        else:
            import mypy.version

            info = {"compiler": f"mypyc {mypy.version.__version__}", "sources": SOURCES}
            info["pgo"] = self.pgo
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(info, indent=1) + "\n")

    pgo: str = "off"
    """How the shared library was built: ``"on"``, ``"off"`` or ``"failed: <why>"``."""

    def build_extensions(self) -> None:
        """Build every extension; with GCC, build the modules' shared library profile-guided
        (see the module docstring). Runs before an in-place build copies the outputs."""
        group = [e for e in self.extensions if e.name.endswith("__mypyc")]
        compiler = getattr(self.compiler, "compiler_so", None) or []
        gcc = bool(group) and _is_gcc(list(compiler))
        if gcc:
            # Calls between the library's own functions go through the PLT, and none of them
            # can be inlined, unless GCC may assume no other library overrides them (nothing
            # does: the per-module extensions reach the library through a capsule). ~8 % fewer
            # instructions per simulated request, ~11 % fewer instruction-cache misses.
            for e in group:
                e.extra_compile_args = [*e.extra_compile_args, "-fno-semantic-interposition"]
        if os.environ.get(PGO_ENV, "") != "1" or not gcc:
            self.pgo = "off"
            super().build_extensions()
            return
        plain = {e.name: (list(e.extra_compile_args), list(e.extra_link_args)) for e in group}
        self._force_rebuild()  # an up-to-date library from an earlier build is not instrumented
        for gcda in Path(self.build_temp).rglob("*.gcda"):
            gcda.unlink()  # a profile of other flags or sources would fail the build
        try:
            for e in group:
                e.extra_compile_args = plain[e.name][0] + _PGO_GENERATE
                e.extra_link_args = plain[e.name][1] + _PGO_GENERATE
            super().build_extensions()
            self._train()
            if not any(Path(self.build_temp).rglob("*.gcda")):
                raise RuntimeError("the training run wrote no profile")
            for e in group:
                e.extra_compile_args = plain[e.name][0] + _PGO_USE
                e.extra_link_args = plain[e.name][1]
                self.build_extension(e)
            self.pgo = "on"
        except Exception as exc:  # PGO costs the speed-up when it fails, never the build
            self.pgo = f"failed: {_short_reason(exc)}"
            print(f"WARNING: sessionroute: PGO {self.pgo}; building without it", flush=True)
            for e in group:
                e.extra_compile_args, e.extra_link_args = plain[e.name]
            super().build_extensions()  # everything plain (the shims may be missing too)

    def _force_rebuild(self) -> None:
        """Rebuild even when outputs look newer than their sources (setuptools skips those)."""
        self.force = True
        if self.compiler is not None:
            self.compiler.force = True

    def _train(self) -> None:
        """Run :data:`TRAINING` on a copy of the package with the instrumented extensions
        (the sources and this build's outputs; the build environment has the package's
        training dependencies, numpy and pydantic, from ``pyproject.toml``)."""
        with tempfile.TemporaryDirectory(prefix="sessionroute-pgo-") as tmp:
            root = Path(tmp)
            shutil.copytree(
                PACKAGE_DIR,
                root / "sessionroute",
                ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__", NATIVE.BUILD_INFO),
            )
            for e in self.extensions:
                built = Path(self.get_ext_fullpath(e.name))
                shutil.copy2(built, root / self.get_ext_filename(e.name))
            (root / "sessionroute" / NATIVE.BUILD_INFO).write_text(
                json.dumps({"compiler": "pgo training", "sources": SOURCES})
            )
            env = {k: v for k, v in os.environ.items() if k != NATIVE.PURE_ENV}
            # the package copy first, then this process's own path: pip's build environment
            # (where numpy and pydantic are installed) is on it
            env["PYTHONPATH"] = os.pathsep.join([str(root), *(p for p in sys.path if p)])
            proc = subprocess.run(
                [sys.executable, "-c", TRAINING],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"exit {proc.returncode}: {tail}")


setup(ext_modules=ext_modules(), cmdclass={"build_ext": RecordingBuildExt})
