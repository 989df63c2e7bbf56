"""scripts/check_fidelity.py (the CI fidelity tier's assertion) on fidelity.json files it reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_fidelity.py"


def _run(
    tmp_path: Path,
    preemptions: list[float],
    hit: float = 0.3,
    replay_pp: float | None = -0.2,
    skipped: int = 0,
    sim: float = 3.0,
) -> subprocess.CompletedProcess[str]:
    arm = "sticky_least_loaded-pressure"
    doc: dict[str, Any] = {
        "checks": [{"what": f"{arm}: preemptions", "ok": True, "detail": "live vs sim"}],
        "arms": {
            arm: {"preemptions": {"live": preemptions, "sim": sim}, "hit_rate": {"live_mean": hit}}
        },
        "replay": {arm: {"error_pp": replay_pp, "runs": [{"skipped": skipped}]}},
    }
    results = {"arms": [{"name": arm, "metrics": {"ideal_hit_rate": 0.79}}]}
    (tmp_path / "fidelity.json").write_text(json.dumps(doc), "utf-8")
    (tmp_path / "results.json").write_text(json.dumps(results), "utf-8")
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "fidelity.json")],
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_pressure_must_preempt_in_some_live_run(tmp_path: Path) -> None:
    """How many preemptions one live run gets moves with the host's timing (0 in one of two
    runs happened on the CPU tier): the setting reaches preemption if some run preempted."""
    out = _run(tmp_path, [0.0, 2.0])
    assert out.returncode == 0, out.stdout
    assert "ok   sticky_least_loaded-pressure: live preemptions [0.0, 2.0]" in out.stdout
    out = _run(tmp_path, [0.0, 0.0])
    assert out.returncode == 1
    assert "FAIL sticky_least_loaded-pressure: live preemptions" in out.stdout


def test_the_sticky_pressure_arm_must_evict(tmp_path: Path) -> None:
    out = _run(tmp_path, [3.0, 5.0], hit=0.78)  # within 0.02 of the infinite cache's 0.79
    assert out.returncode == 1
    assert "sticky_least_loaded-pressure: eviction" in out.stdout


def test_the_replay_gates_the_cache_model(tmp_path: Path) -> None:
    """The live requests replayed at their send times into the simulator's engine: the hit
    rate within 3 points of the live one, and every request's replica known."""
    assert _run(tmp_path, [3.0, 5.0]).returncode == 0
    out = _run(tmp_path, [3.0, 5.0], replay_pp=4.5)
    assert out.returncode == 1 and "FAIL sticky_least_loaded-pressure: replayed hit rate +4.5" in (
        out.stdout
    )
    assert _run(tmp_path, [3.0, 5.0], skipped=2).returncode == 1
    assert _run(tmp_path, [3.0, 5.0], replay_pp=None).returncode == 1


def test_output_tok_s_gates_without_pressure_only(tmp_path: Path) -> None:
    """Output tok/s holds on the CPU tier without KV pressure (it gates there); under pressure
    a miss is reported, not gating."""

    def run(arm: str) -> subprocess.CompletedProcess[str]:
        doc: dict[str, Any] = {
            "checks": [{"what": f"{arm}: output_tok_s", "ok": False, "detail": "+30 %"}],
            "arms": {},
            "replay": {},
        }
        (tmp_path / "fidelity.json").write_text(json.dumps(doc), "utf-8")
        (tmp_path / "results.json").write_text(json.dumps({"arms": []}), "utf-8")
        return subprocess.run(
            [sys.executable, str(SCRIPT), str(tmp_path / "fidelity.json")],
            capture_output=True,
            text=True,
            check=False,
        )

    light = run("random")
    assert light.returncode == 1 and "FAIL random: output_tok_s" in light.stdout
    pressure = run("random-pressure")
    assert pressure.returncode == 0 and "miss random-pressure: output_tok_s" in pressure.stdout


def test_the_simulator_must_preempt_in_some_pressure_arm(tmp_path: Path) -> None:
    """Each pressure arm's preemptions on both sides are reported, not gating (a sticky arm's
    few per run hang on which turns meet); the simulator preempting under pressure gates."""
    assert _run(tmp_path, [3.0, 5.0], sim=0.25).returncode == 0
    out = _run(tmp_path, [3.0, 5.0], sim=0.0)
    assert out.returncode == 1 and "FAIL pressure setting: simulated preemptions" in out.stdout
