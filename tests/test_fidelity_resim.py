"""scripts/fidelity_resim.py: what it scales each arm's step terms by (host speed, decode pace)."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fidelity_resim.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fidelity_resim", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_arm_is_scaled_by_its_runs_mean_speed_over_the_calibrations() -> None:
    runs = [
        {"arm": "a", "host_cpu": {"loop_ms": 2.0}},
        {"arm": "a", "host_cpu": {"loop_ms": 3.0}},
        {"arm": "b", "host_cpu": {"loop_ms": 1.0}},
        {"arm": "c", "host_cpu": None},  # not measured: left out (scaled by 1)
    ]
    fid = {
        "conditions": {
            "host_cpu": {"calibration": {"loop_ms": 2.0}},
            "decode_pace": {"runs": runs},
        }
    }
    factors = _script().speed_factors(fid)
    assert factors == {"a": pytest.approx(1.25), "b": pytest.approx(0.5)}
    fid["conditions"]["host_cpu"]["calibration"] = None
    assert _script().speed_factors(fid) == {}


def test_a_scaled_profile_multiplies_every_step_term_and_nothing_else(tmp_path: Path) -> None:
    src = tmp_path / "p.toml"
    src.write_text(
        "[profiles.x]\nb0_s = 0.001\nb_tok_s = 2e-5\nb_req_s = 0.01\nmax_num_seqs = 16\n"
        "path_delay_s = 0.02\n"
    )
    out = _script()._scaled(src, 1.5, tmp_path, "arm")
    table = tomllib.loads(out.read_text())["profiles"]["x"]
    assert table["b0_s"] == pytest.approx(0.0015) and table["b_req_s"] == pytest.approx(0.015)
    assert table["b_tok_s"] == pytest.approx(3e-5)
    assert table["max_num_seqs"] == 16 and table["path_delay_s"] == pytest.approx(0.02)


def test_each_arm_is_scaled_by_its_measured_decode_pace_over_the_calibrations() -> None:
    runs = [
        {"arm": "a", "before_s": [0.002, 0.0], "after_s": [0.004, 0.003]},  # 0: not measured
        {"arm": "a", "before_s": [0.003], "after_s": [0.003]},
        {"arm": "b", "before_s": [], "after_s": []},  # the servers did not answer
    ]
    fid = {"conditions": {"decode_pace": {"calibration_s": 0.002, "runs": runs}}}
    assert _script().pace_factors(fid) == {"a": pytest.approx(1.5)}
    fid["conditions"]["decode_pace"]["calibration_s"] = None
    assert _script().pace_factors(fid) == {}
