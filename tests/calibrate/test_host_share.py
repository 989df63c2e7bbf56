"""Replicas sharing a host's cores: the fit, the profile file, the simulator and the probe."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sessionroute.calibrate import write_profile
from sessionroute.calibrate.hostshare import fit_host_share
from sessionroute.calibrate.result import write_host_share
from sessionroute.emulate import EmulatorHandle, EmulatorSettings, start_emulators, stop_all
from sessionroute.errors import ConfigError
from sessionroute.experiments.live.host_probe import probe_host_share
from sessionroute.experiments.spec import load_experiment, resolve_arms
from sessionroute.replica import load_profile_file
from sessionroute.sim import SimSpec
from sessionroute.sim.runner import run_simulation

from .test_profile_file import _experiment, _result


def test_the_share_is_the_slowdown_per_other_busy_replica() -> None:
    # 3 replicas: together 2x alone -> each other busy one adds half a step
    fit = fit_host_share([0.002, 0.0021, 0.0019], [0.004, 0.0041, 0.0039], 3)
    assert fit.share == pytest.approx(0.5)
    assert (fit.itl_alone_s, fit.itl_all_s, fit.rounds) == (0.002, 0.004, 3)
    assert fit_host_share([0.003], [0.002], 3).share == 0.0  # faster together: none
    assert fit_host_share([0.002], [0.004], 1).share == 0.0  # one replica: nothing shared
    with pytest.raises(ValueError, match="no measured round"):
        fit_host_share([], [0.004], 3)
    with pytest.raises(ValueError, match="> 0"):
        fit_host_share([0.0], [0.004], 3)


def test_the_factor_is_one_with_the_calibrated_replicas_busy() -> None:
    p = _result().profile
    assert p.host_factor(3) == 1.0  # no share: every replica a machine of its own
    shared = dataclasses.replace(p, host_share=0.5, host_share_replicas=3)
    assert shared.host_factor(3) == pytest.approx(1.0)
    assert shared.host_factor(1) == pytest.approx(0.5)
    assert shared.host_factor(0) == pytest.approx(0.5)  # idle counts as one
    assert shared.host_factor(2) == pytest.approx(0.75)


def test_the_host_share_round_trips_through_the_profile_file(tmp_path: Path) -> None:
    # step terms fitted with every server busy: they are the steps of 3 busy
    together = dataclasses.replace(_result(), probe="together")
    path = write_profile(together, tmp_path / "profile.toml")
    fit = fit_host_share([0.002], [0.004], 3)
    out = write_host_share(path, fit, tmp_path / "shared.toml")
    pf = load_profile_file(out)
    assert pf.profile.host_share == pytest.approx(0.5)
    assert pf.profile.host_share_replicas == 3
    # fitted on one server alone (probe first or all): the steps of one busy
    alone = write_profile(_result(), tmp_path / "alone.toml")
    assert load_profile_file(write_host_share(alone, fit, alone)).profile.host_share_replicas == 1
    assert pf.calibration["host"]["itl_all_s"] == pytest.approx(0.004)
    assert pf.calibration["date"] == _result().date  # the rest kept
    bad = out.read_text().replace("host_share_replicas = 3", "host_share_replicas = 0")
    (tmp_path / "bad.toml").write_text(bad)
    with pytest.raises(ConfigError, match="host_share_replicas must be >= 1"):
        load_profile_file(tmp_path / "bad.toml")


def _itl_mean(tmp_path: Path, name: str, share: float, sessions: int) -> float:
    path = write_profile(
        dataclasses.replace(_result(), probe="together"), tmp_path / f"{name}.toml"
    )
    if share:
        path = write_host_share(path, fit_host_share([0.002], [0.002 * (1 + share)], 2), path)
    f = _experiment(tmp_path, path)
    f.write_text(
        f.read_text()
        .replace("sessions = 4", f"sessions = {sessions}\narrival_rate_per_s = 1000.0")
        .replace('policy = "sticky_least_loaded"', 'policy = "round_robin"')
    )
    (arm,) = resolve_arms(load_experiment(f))
    r = run_simulation(SimSpec.from_settings(arm.settings), arm.policy, arm.policy_options, 0)
    return float(r.metrics["itl_s"]["mean"])


def test_the_simulator_decodes_faster_with_fewer_replicas_busy(tmp_path: Path) -> None:
    """Steps are fitted with both replicas busy (host_share_replicas 2): a session alone keeps
    one replica busy and decodes in 1 / (1 + share) of the fitted step; with many sessions
    both replicas are busy part of the time, and the decode is slower than alone, never
    slower than the fitted pace."""
    alone = _itl_mean(tmp_path, "alone0", 0.0, 1)
    alone_shared = _itl_mean(tmp_path, "alone1", 1.0, 1)
    assert alone_shared == pytest.approx(alone / 2, rel=0.02)
    many = _itl_mean(tmp_path, "many0", 0.0, 12)
    many_shared = _itl_mean(tmp_path, "many1", 1.0, 12)
    assert many / 2 * 1.05 < many_shared < many


@pytest.fixture
async def emus() -> AsyncIterator[list[EmulatorHandle]]:
    hs = await start_emulators(2, EmulatorSettings(port=0, time_scale=100))
    yield hs
    await stop_all(hs)


async def test_the_probe_reads_the_servers_own_itl(emus: list[EmulatorHandle]) -> None:
    """Emulated replicas share nothing: the probe measures their pace alone and together."""
    urls = [h.url for h in emus]
    fit = await probe_host_share(urls, streams=2, tokens=16, rounds=2)
    assert fit is not None
    assert fit.replicas == 2 and fit.rounds == 2
    assert fit.itl_alone_s > 0 and fit.itl_all_s > 0 and fit.share >= 0
    assert await probe_host_share(urls[:1]) is None
