"""A calibrated profile file round-trips through ``[replicas] profile = "path"``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from sessionroute.calibrate import CalibrationResult, default_plan, write_profile
from sessionroute.calibrate.fit import fit_rows, phase_row
from sessionroute.calibrate.result import build_profile
from sessionroute.errors import ConfigError
from sessionroute.experiments.spec import load_experiment, resolve_arms
from sessionroute.replica import load_profile_file, load_profiles
from sessionroute.sim import SimSpec, replica_config
from sessionroute.sim.runner import run_simulation

from .test_fit import SERVER, _runs


def _result() -> CalibrationResult:
    runs = _runs(0.0)
    fit = fit_rows([r for r in (phase_row(run) for run in runs) if r is not None])
    return CalibrationResult(
        profile=build_profile(fit.values, (SERVER,)),
        block_size=SERVER.block_size,
        servers=(SERVER,),
        plan=default_plan(SERVER, reps=3),
        runs=tuple(runs),
        fit=fit,
        date="2026-12-06T08:00:00+00:00",
        wall_s=12.0,
    )


def _experiment(tmp_path: Path, profile: Path, extra: str = "") -> Path:
    f = tmp_path / "exp.toml"
    f.write_text(
        f"""
name = "calibrated"
[workload]
kind = "toy"
[workload.options]
sessions = 4
turns_p50 = 2
turns_p90 = 3
turns_max = 3
[replicas]
count = 2
profile = "{profile}"
{extra}
[[arms]]
policy = "sticky_least_loaded"
"""
    )
    return f


def simulate_one_turn(
    tmp_path: Path, profile: Path, sessions: int, options: str = "", policy: str = ""
) -> dict[str, Any]:
    """The metrics of ``sessions`` one-turn sessions sent together (:func:`_experiment`'s
    file on ``profile``; ``options`` more workload options, ``policy`` another arm)."""
    f = _experiment(tmp_path, profile)
    text = (
        f.read_text()
        .replace("sessions = 4", f"sessions = {sessions}\narrival_rate_per_s = 1000.0\n{options}")
        .replace("turns_max = 3", "turns_max = 1")
        .replace("turns_p50 = 2", "turns_p50 = 1")
        .replace("turns_p90 = 3", "turns_p90 = 1")
    )
    if policy:
        text = text.replace('policy = "sticky_least_loaded"', f'policy = "{policy}"')
    f.write_text(text)
    (arm,) = resolve_arms(load_experiment(f))
    return run_simulation(
        SimSpec.from_settings(arm.settings), arm.policy, arm.policy_options, 0
    ).metrics


def test_written_profile_reads_back_equal(tmp_path: Path) -> None:
    result = _result()
    path = write_profile(result, tmp_path / "sub" / "profile.toml")
    pf = load_profile_file(path)
    assert pf.profile == result.profile
    assert pf.block_size == 32
    assert pf.calibration["date"] == result.date
    assert pf.calibration["servers"][0]["num_gpu_blocks"] == 1024
    # also an ordinary profiles file
    assert load_profiles(path)["calibrated-m"] == result.profile
    assert "host_loop_ms" not in pf.calibration  # not measured: not written
    # the host's speed while calibrating, where compare --fidelity measured it, is kept
    timed = dataclasses.replace(result, host_loop_ms=1.33)
    assert load_profile_file(write_profile(timed, tmp_path / "t.toml")).calibration[
        "host_loop_ms"
    ] == pytest.approx(1.33)


def test_replicas_profile_path_takes_the_servers_settings(tmp_path: Path) -> None:
    result = _result()
    path = write_profile(result, tmp_path / "profile.toml")
    spec = load_experiment(_experiment(tmp_path, path))
    (arm,) = resolve_arms(spec)
    count, cfg = replica_config(SimSpec.from_settings(arm.settings))
    assert count == 2
    assert cfg.profile == result.profile
    assert cfg.block_size == 32  # the server's, not the simulator's default 16
    assert cfg.capacity_tokens == 32736  # the server's (1023 usable blocks), not the toy's 65536
    assert (cfg.seqs, cfg.batched_tokens) == (16, 2048)
    out = run_simulation(SimSpec.from_settings(arm.settings), "sticky_least_loaded", seed=0)
    assert out.metrics["requests_completed"] > 0
    assert out.resolved["replica"]["profile"] == "calibrated-m"
    assert out.resolved["replica"]["block_size"] == 32


def test_explicit_replicas_keys_override_the_file(tmp_path: Path) -> None:
    path = write_profile(_result(), tmp_path / "profile.toml")
    extra = "max_num_seqs = 8\nkv_capacity_tokens = 4096\nblock_size = 64"
    spec = load_experiment(_experiment(tmp_path, path, extra))
    (arm,) = resolve_arms(spec)
    _, cfg = replica_config(SimSpec.from_settings(arm.settings))
    assert (cfg.seqs, cfg.capacity_tokens, cfg.block_size) == (8, 4096, 64)


def test_a_file_with_several_profiles_must_name_one(tmp_path: Path) -> None:
    f = tmp_path / "two.toml"
    f.write_text('[profiles.a]\nbase = "toy-8b-h100-tp1"\n[profiles.b]\nbase = "toy-8b-h100-tp1"\n')
    with pytest.raises(ConfigError, match="defines 2 profiles"):
        load_profile_file(f)
    f.write_text(f.read_text() + '[calibration]\nprofile = "b"\nblock_size = 32\n')
    pf = load_profile_file(f)
    assert pf.profile.name == "b" and pf.block_size == 32


def test_missing_profile_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read profiles"):
        load_experiment(_experiment(tmp_path, tmp_path / "nope.toml"))
