"""scripts/fidelity_resim.py: what it scales each arm's step terms by (host speed, decode pace)."""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sessionroute.replica.profiles import load_profile_file

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
    fid: dict[str, Any] = {
        "conditions": {
            "host_cpu": {"calibration": {"loop_ms": 2.0}},
            "decode_pace": {"runs": runs},
        }
    }
    factors = _script().speed_factors(fid)
    assert factors == {"a": pytest.approx(1.25), "b": pytest.approx(0.5)}
    fid["conditions"]["host_cpu"]["calibration"] = None
    assert _script().speed_factors(fid) == {}


def test_the_host_speed_can_be_set_against_the_path_probes_instead() -> None:
    runs = [{"arm": "a", "host_cpu": {"loop_ms": 3.0}}, {"arm": "b", "host_cpu": {"loop_ms": 1.0}}]
    fid: dict[str, Any] = {
        "conditions": {
            "host_cpu": {"calibration": {"loop_ms": 1.0}, "path_probe": {"loop_ms": 2.0}},
            "decode_pace": {"runs": runs},
        }
    }
    got = _script().speed_factors(fid, "path_probe")
    assert got == {"a": pytest.approx(1.5), "b": pytest.approx(0.5)}
    assert _script().speed_factors(fid) == {"a": pytest.approx(3.0), "b": pytest.approx(1.0)}
    # the profile's own host_loop_ms stands in for the calibration only
    fid["conditions"]["host_cpu"] = {}
    fid["conditions"]["calibration"] = {"host_loop_ms": 1.5}
    assert _script().speed_factors(fid) == {"a": pytest.approx(2.0), "b": pytest.approx(2 / 3)}
    assert _script().speed_factors(fid, "path_probe") == {}


def test_one_factor_gives_every_arm_the_mean_of_the_arms_factors() -> None:
    got = _script().one_factor({"a": 1.5, "b": 0.5, "c": 1.3})
    assert got == {"a": pytest.approx(1.1), "b": pytest.approx(1.1), "c": pytest.approx(1.1)}
    assert _script().one_factor({}) == {}


def test_a_scaled_profile_multiplies_every_step_term_its_own_or_its_bases(
    tmp_path: Path,
) -> None:
    src = tmp_path / "p.toml"
    src.write_text(
        '[profiles.x]\nbase = "toy-8b-h100-tp1"\nb0_s = 0.001\nb_req_s = 0.01\n'
        "max_num_seqs = 16\npath_delay_s = 0.02\n"
    )
    base = load_profile_file(src).profile
    out = _script()._scaled(src, 1.5, tmp_path, "arm")
    got = load_profile_file(out).profile
    assert got.b0_s == pytest.approx(0.0015) and got.b_req_s == pytest.approx(0.015)
    assert got.b_tok_s == pytest.approx(1.5 * base.b_tok_s) and base.b_tok_s > 0  # the base's
    assert got.max_num_seqs == 16 and got.path_delay_s == pytest.approx(0.02)
    flat = tmp_path / "flat.toml"
    flat.write_text("b0_s = 0.001\n")
    with pytest.raises(SystemExit, match="not a profile file"):
        _script()._scaled(flat, 1.5, tmp_path, "arm")


def test_each_arm_is_scaled_by_its_measured_decode_pace_over_the_calibrations() -> None:
    runs = [
        {"arm": "a", "before_s": [0.002, 0.0], "after_s": [0.004, 0.003]},  # 0: not measured
        {"arm": "a", "before_s": [0.003], "after_s": [0.003]},
        {"arm": "b", "before_s": [], "after_s": []},  # the servers did not answer
    ]
    fid: dict[str, Any] = {"conditions": {"decode_pace": {"calibration_s": 0.002, "runs": runs}}}
    assert _script().pace_factors(fid) == {"a": pytest.approx(1.5)}
    fid["conditions"]["decode_pace"]["calibration_s"] = None
    assert _script().pace_factors(fid) == {}


def test_speed_noise_redraws_every_replica_every_period_with_mean_speed_one() -> None:
    faults = _script().speed_noise(0.3, 0.5, 2, seed=1, until_s=2000.0)
    assert len(faults) == 2 * 4001
    assert {f.kind for f in faults} == {"slow"}
    assert [(f.at_s, f.replica) for f in faults[:4]] == [(0.0, 0), (0.0, 1), (0.5, 0), (0.5, 1)]
    speeds = [1 / f.factor for f in faults]  # a slow fault's factor multiplies step time
    mean = statistics.fmean(speeds)
    assert mean == pytest.approx(1.0, abs=0.01)
    assert statistics.pstdev(speeds) / mean == pytest.approx(0.3, rel=0.03)
    again = _script().speed_noise(0.3, 0.5, 2, seed=1, until_s=2000.0)
    assert [f.factor for f in again] == [f.factor for f in faults]  # seeded
    assert {f.factor for f in _script().speed_noise(0.0, 1.0, 1, seed=0, until_s=5.0)} == {1.0}
    with pytest.raises(ValueError, match="period > 0"):
        _script().speed_noise(0.3, 0.0, 2, seed=0, until_s=5.0)
    with pytest.raises(ValueError, match="finite cv"):
        _script().speed_noise(float("nan"), 0.5, 2, seed=0, until_s=5.0)


def test_the_noise_covers_the_longest_live_run() -> None:
    def rep(tokens: float, rate: float) -> dict[str, Any]:
        return {"metrics": {"output_tokens": tokens, "output_tokens_per_s": rate}}

    results = {
        "arms": [
            {"name": "a", "repeats": [rep(1000, 100), rep(1000, 50)]},
            {"name": "b", "repeats": [rep(0, 0)]},
        ]
    }
    runs = _script().live_runs(results)
    assert list(runs) == ["a", "b"] and len(runs["a"]) == 2
    assert _script().live_span_s(runs) == pytest.approx(20.0)
    assert _script().live_span_s({}) is None


class _Run:
    def __init__(self, **metrics: Any) -> None:
        self.metrics = metrics


def test_each_metric_gets_compares_verdict_per_noise_draw() -> None:
    live = [
        {"prefix_cache_hit_rate": 0.50, "preemptions": 0},
        {"prefix_cache_hit_rate": 0.52, "preemptions": 0},
    ]
    # noise draw 1: hit rate +1 point, no preemption; draw 2: +8 points, one preemption
    draws = [
        [_Run(prefix_cache_hit_rate=0.52, preemptions=0)],
        [_Run(prefix_cache_hit_rate=0.59, preemptions=1)],
    ]
    lines = _script().describe_arm("a", live, draws)
    hit = next(ln for ln in lines if "hit rate" in ln)
    assert "+4.5 pp (within in 1 of 2 noise draws)" in hit  # bound 3 + noise 1 on draw 1
    pre = next(ln for ln in lines if "preemptions" in ln)
    assert "(both or neither in 1 of 2 noise draws)" in pre
    one = _script().describe_arm("a", live, draws[1:])
    assert "(outside)" in next(ln for ln in one if "hit rate" in ln)
    assert "(one side only)" in next(ln for ln in one if "preemptions" in ln)


def test_a_bad_experiment_file_is_named_without_a_traceback(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "fidelity.json").write_text('{"conditions": {"engine": {}, "profile": "p"}}')
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[[arms]]\npolicy = "nope"\n')
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), str(bad)], capture_output=True, text=True
    )
    assert r.returncode == 2
    assert "bad.toml" in r.stderr and "unknown policy 'nope'" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_refit_without_the_probes_turns_names_the_file(tmp_path: Path) -> None:
    """--refit needs OUT/path_probe_turns.json (outputs before 2026-12-07 lack it)."""
    out = tmp_path / "out"
    out.mkdir()
    profile = tmp_path / "p.toml"
    profile.write_text('[profiles.p]\nbase = "toy-8b-h100-tp1"\n')
    (out / "fidelity.json").write_text(
        json.dumps({"conditions": {"engine": {}, "profile": str(profile)}})
    )
    exp = tmp_path / "exp.toml"
    exp.write_text('name = "x"\n[[arms]]\npolicy = "random"\n')
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), str(exp), "--refit", "sharing"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 2
    assert "path_probe_turns.json: not found" in r.stderr and "Traceback" not in r.stderr
