"""scripts/vllm_scheduler_check.py's refusals: a directory that is no fidelity output, and one
whose turns.json holds no turns (a check of nothing must not pass). The comparison itself needs
vLLM and runs in the CI fidelity tier (scripts/ci_fidelity_tier.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "vllm_scheduler_check.py"


def _run(out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--model", "unused"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def test_a_directory_without_a_fidelity_output_is_named_and_refused(tmp_path: Path) -> None:
    done = _run(tmp_path / "nowhere")
    assert done.returncode == 2
    assert f"{tmp_path / 'nowhere' / 'fidelity.json'} not found" in done.stderr
    assert "Traceback" not in done.stderr
    (tmp_path / "fidelity.json").write_text("{}", "utf-8")  # an output from before turns.json
    done = _run(tmp_path)
    assert done.returncode == 2 and "turns.json not found" in done.stderr


def test_turns_json_without_turns_fails_instead_of_passing_on_nothing(tmp_path: Path) -> None:
    (tmp_path / "fidelity.json").write_text("{}", "utf-8")
    (tmp_path / "turns.json").write_text(json.dumps({"random": [[], []]}), "utf-8")
    done = _run(tmp_path)
    assert done.returncode == 1 and "holds no turns: nothing to check" in done.stderr
