"""The mypyc-compiled replica model (:mod:`sessionroute.native`): what is compiled, the
stale-build guard, the pure-Python switch, compiled == pure results, and an install without a
working C compiler."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from sessionroute.native import (
    BUILD_INFO,
    COMPILED_MODULES,
    PURE_ENV,
    SIM_KERNEL,
    build_failure,
    compiled_modules,
    install_guard,
    pgo_status,
    pure_reason,
    source_digest,
    stale_modules,
)

_PACKAGE = Path(__file__).resolve().parents[1] / "src" / "sessionroute"


def test_only_the_replica_model_its_keys_and_heap_and_the_sim_kernel_are_compiled() -> None:
    replica = sorted(
        f"sessionroute.replica.{p.stem}"
        for p in (_PACKAGE / "replica").glob("*.py")
        if p.stem != "__init__"
    )
    assert len(replica) >= 5
    assert all(m.startswith("sessionroute.sim.") for m in SIM_KERNEL)
    assert sorted(COMPILED_MODULES) == sorted(
        ["sessionroute.keys", "sessionroute.minheap", *replica, *SIM_KERNEL]
    )


def _fake_package(tmp_path: Path, module: str, source: str) -> Path:
    """A package folder holding ``module``'s source and an (empty) extension beside it."""
    parts = module.split(".")[1:]
    src = tmp_path.joinpath(*parts[:-1], parts[-1] + ".py")
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(source)
    src.with_name(parts[-1] + EXTENSION_SUFFIXES[0]).write_bytes(b"")
    return src


def test_extension_without_a_matching_recorded_source_is_stale(tmp_path: Path) -> None:
    module = COMPILED_MODULES[0]
    src = _fake_package(tmp_path, module, "X = 1\n")
    assert stale_modules(tmp_path) == [module]  # no build record
    (tmp_path / BUILD_INFO).write_text(json.dumps({"sources": {module: source_digest(src)}}))
    assert stale_modules(tmp_path) == []
    src.write_text("X = 2\n")  # edited after the build
    assert stale_modules(tmp_path) == [module]
    (tmp_path / BUILD_INFO).write_text("{not json")
    assert stale_modules(tmp_path) == [module]


def test_modules_without_an_extension_are_never_stale(tmp_path: Path) -> None:
    module = COMPILED_MODULES[1]
    src = _fake_package(tmp_path, module, "Y = 1\n")
    src.with_name(src.stem + EXTENSION_SUFFIXES[0]).unlink()
    assert stale_modules(tmp_path) == []


def _python(code: str, *, pure: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    if pure:
        env[PURE_ENV] = "1"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_pure_python_switch_imports_every_compiled_module_from_source() -> None:
    out = _python(
        "import sessionroute.replica as e, sessionroute.native as n, sys\n"
        "print(sorted(m for m in n.COMPILED_MODULES if m in sys.modules"
        " and not sys.modules[m].__file__.endswith('.py')))\n"
        "print(n.compiled_modules())",
        pure=True,
    )
    assert out.split("\n")[:2] == ["[]", "[]"]


_RESULTS = """
import hashlib, json
from sessionroute.bench.closed_loop import run_closed_loop
from sessionroute.clock import ManualClock
from sessionroute.replica import PROFILES, ReplicaConfig
from sessionroute.native import compiled_modules
from sessionroute.sim import SimSpec, run_simulation

WALL = {"wall_seconds", "requests_per_wall_second", "cpu_seconds", "requests_per_cpu_second",
        "steps_per_wall_second"}
cfg = ReplicaConfig(PROFILES["glm45air-h200-tp8"], block_size=16)
bench = run_closed_loop(cfg, fast=True, sessions=64, max_context=40000, requests=600, seed=3)
spec = SimSpec.model_validate({"workload": {"kind": "swe-rl", "steps": 1}})
sim = run_simulation(spec, "sticky_least_loaded", seed=1, wall_clock=ManualClock())
out = [{k: v for k, v in bench.items() if k not in WALL},
       {k: v for k, v in sim.metrics.items() if k not in WALL}, sim.timeseries, sim.steps]
print(len(compiled_modules()))
print(hashlib.sha256(json.dumps(out, sort_keys=True, default=repr).encode()).hexdigest())
"""


@pytest.mark.slow
def test_compiled_and_pure_python_give_identical_results() -> None:
    if not compiled_modules():
        pytest.skip("no compiled build here (installed with SESSIONROUTE_PURE_PYTHON=1?)")
    n_compiled, compiled = _python(_RESULTS, pure=False).split()
    n_pure, pure = _python(_RESULTS, pure=True).split()
    assert (int(n_compiled), int(n_pure)) == (len(COMPILED_MODULES), 0)
    assert compiled == pure


def test_a_failed_build_warns_at_every_run_and_names_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PURE_ENV, raising=False)
    (tmp_path / BUILD_INFO).write_text(json.dumps({"failed": "command 'gcc' failed"}))
    assert build_failure(tmp_path) == "command 'gcc' failed"
    with pytest.warns(RuntimeWarning, match=r"not compiled at install \(command 'gcc' failed\)"):
        assert install_guard(tmp_path) is False  # nothing compiled there: nothing to bypass
    assert pure_reason(tmp_path) == "compiling failed at install: command 'gcc' failed"
    monkeypatch.setenv(PURE_ENV, "1")
    assert pure_reason(tmp_path) == f"{PURE_ENV} is set"


def test_a_successful_build_record_is_no_failure(tmp_path: Path) -> None:
    (tmp_path / BUILD_INFO).write_text(json.dumps({"compiler": "mypyc", "sources": {}}))
    assert build_failure(tmp_path) is None
    assert build_failure(tmp_path / "missing") is None


def test_the_build_record_says_how_the_library_was_built(tmp_path: Path) -> None:
    assert pgo_status(tmp_path) == "unknown"  # no record
    (tmp_path / BUILD_INFO).write_text(json.dumps({"sources": {}, "pgo": "on"}))
    assert pgo_status(tmp_path) == "on"
    (tmp_path / BUILD_INFO).write_text(json.dumps({"pgo": "training failed: exit 1: boom"}))
    assert pgo_status(tmp_path) == "training failed: exit 1: boom"


def test_this_install_recorded_how_the_library_was_built() -> None:
    # "off" unless the build opted in with SESSIONROUTE_PGO=1 (then "on", or "failed: ..." -
    # a failed training run must not pass unnoticed)
    if not compiled_modules():
        failed = build_failure()
        if failed:
            pytest.fail(f"the install did not compile the hot modules: {failed}")
        pytest.skip("no compiled build here (installed with SESSIONROUTE_PURE_PYTHON=1?)")
    assert pgo_status() in ("on", "off")


@pytest.mark.slow
def test_an_install_without_a_c_compiler_is_pure_python_with_the_same_results(
    tmp_path: Path,
) -> None:
    """``pip install`` with ``CC=/bin/false``: the build reports the failure, installs the pure
    package, records why (every run then warns), and the results equal a pure-Python run."""
    root = _PACKAGE.parents[1]
    if not (root / "setup.py").is_file() or shutil.which("gcc") is None:
        pytest.skip("needs the source tree (setup.py) and a build toolchain for pip")
    src = tmp_path / "src"
    shutil.copytree(
        root,
        src,
        ignore=shutil.ignore_patterns(
            ".*", "*.so", "_compiled.json", "__pycache__", "build", "runs", "tests", "docs"
        ),
    )
    target = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    env["CC"] = "/bin/false"
    pip = [sys.executable, "-m", "pip", "install", "-v", "--no-deps"]
    done = subprocess.run(
        [*pip, "--target", str(target), str(src)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "WARNING: sessionroute: compiling the replica model failed" in done.stdout + done.stderr
    installed = target / "sessionroute"
    assert not [p.name for p in installed.rglob("*") if p.suffix in (".so", ".pyd")]
    assert build_failure(installed) is not None
    run_env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    run_env["PYTHONPATH"] = str(target)
    ran = subprocess.run(
        [sys.executable, "-c", _RESULTS], env=run_env, capture_output=True, text=True, timeout=600
    )
    assert ran.returncode == 0, ran.stderr
    assert "not compiled at install" in ran.stderr
    n_compiled, digest = ran.stdout.split()
    assert int(n_compiled) == 0
    assert digest == _python(_RESULTS, pure=True).split()[1]
