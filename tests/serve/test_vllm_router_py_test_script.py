"""scripts/vllm_router_py_test.sh swaps vllm-router's launcher for ``sessionroute serve``: a
stand-in checkout whose one integration test runs the launcher as vllm-router's fixtures do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "vllm_router_py_test.sh"

_TEST = """
import subprocess


def test_the_launcher_is_swapped():
    out = subprocess.run(
        ["python3", "-m", "vllm_router.launch_router", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert "sessionroute serve" in out
"""


def test_the_script_runs_the_checkouts_tests_against_sessionroute_serve(tmp_path: Path) -> None:
    checkout = tmp_path / "router"
    integration = checkout / "py_test" / "integration"
    integration.mkdir(parents=True)
    (integration / "test_launcher.py").write_text(_TEST)
    out_dir = tmp_path / "out"
    env = {**os.environ, "SR_PYTHON": sys.executable, "PY_TEST_OUT": str(out_dir)}
    run = subprocess.run(
        ["bash", str(SCRIPT), str(checkout), "sessionroute"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    assert (out_dir / "sessionroute.xml").is_file()
    usage = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert usage.returncode == 2 and "ROUTER_CHECKOUT" in usage.stderr
