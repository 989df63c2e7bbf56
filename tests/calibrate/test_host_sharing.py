"""Servers sharing a host (``compare --fidelity``'s path probe): the fit of how their steps
slow down while the others are busy, the profile fields it writes, the replay and the
simulator applying them."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest

from sessionroute.calibrate import write_profile
from sessionroute.calibrate.host import HostFit, HostSample, fit_host
from sessionroute.calibrate.path import PathSample, fit_path_delay
from sessionroute.errors import ConfigError
from sessionroute.experiments.live.path_probe import host_samples
from sessionroute.experiments.replay import (
    busy_others,
    busy_spans,
    host_schedule,
    replay_results,
)
from sessionroute.replica import PROFILES, load_profile_file
from sessionroute.replica.api import ReplicaConfig
from sessionroute.sim.replicas import SimReplica

from .test_profile_file import _result, simulate_one_turn

TOY = PROFILES["toy-8b-h100-tp1"]


def _samples(c0: float, k: float, sd: float, n: int = 240, seed: int = 3) -> list[HostSample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        busy = (i % 11) / 10  # 0.0 .. 1.0
        out.append(HostSample(busy, c0 * (1 + k * busy) * (1 + rng.gauss(0, sd))))
    return out


def test_a_slowdown_while_the_other_server_is_busy_is_fitted() -> None:
    fit = fit_host(_samples(0.9, 0.5, 0.05))
    assert fit.shared
    assert fit.path_step_factor == pytest.approx(0.9, rel=0.05)
    assert fit.peer_busy_slowdown == pytest.approx(0.5, rel=0.15)
    assert fit.samples == 240 and len(fit.bins) == 20
    assert [c for _, c, _ in fit.bins] == [12] * 20
    assert fit.as_dict()["bins"][0]["requests"] == 12


def test_no_measurable_slowdown_leaves_the_median_factor() -> None:
    fit = fit_host(_samples(1.2, 0.0, 0.2))
    assert not fit.shared and fit.peer_busy_slowdown == 0.0
    assert fit.path_step_factor == pytest.approx(1.2, rel=0.05)


def test_the_fit_refuses_nothing_and_bad_ratios() -> None:
    with pytest.raises(ValueError, match="no path probe"):
        fit_host([])
    with pytest.raises(ValueError, match="> 0"):
        fit_host([HostSample(0.0, 0.0)])


def _turn(sent: float, latency: float, replica: int, output: int = 16, ttft: float = 0.01) -> Any:
    return {
        "sent_s": sent, "latency_s": latency, "ttft_s": ttft, "replica": replica,
        "prompt_len": 64, "output_len": output,
        "block_keys": [int(sent * 1000) * 10 + replica * 5 + i for i in range(4)],
        "cache_salt": None, "cached_tokens": 0,
    }  # fmt: skip


def test_busy_spans_merge_and_count_the_other_servers() -> None:
    turns = [_turn(0.0, 1.0, 0), _turn(0.5, 1.0, 0), _turn(1.0, 1.0, 1), _turn(9.0, 1.0, -1)]
    spans = busy_spans(turns)
    assert spans == {0: [(0.0, 1.5)], 1: [(1.0, 2.0)]}  # unknown replica left out
    assert busy_others(spans, 0, 0.0, 2.0) == pytest.approx(0.5)
    assert busy_others(spans, 1, 0.0, 2.0) == pytest.approx(0.75)
    assert busy_others(spans, 0, 1.2, 1.2) == 1.0  # an instant
    shared = dataclasses.replace(TOY, peer_busy_slowdown=0.5, path_step_factor=2.0)
    cfg = ReplicaConfig(shared)
    assert host_schedule(spans, 0, cfg) == [(1.0, 3.0), (2.0, 2.0)]
    assert host_schedule(spans, 0, ReplicaConfig(TOY)) == []  # nothing shared: no schedule


def _decode_s(turns: list[Any], profile: Any, index: int) -> float:
    res = replay_results(turns, ReplicaConfig(profile, kv_capacity_tokens=8192), replicas=2)
    r = res[index]
    assert r is not None
    return r.finish_s - r.first_token_s


def test_the_replay_slows_a_server_while_the_other_is_busy() -> None:
    alone = [_turn(0.0, 1.0, 0, output=64)]
    together = [*alone, _turn(0.0, 100.0, 1, output=64)]  # replica 1 busy through it (live)
    shared = dataclasses.replace(TOY, peer_busy_slowdown=0.5)
    base = _decode_s(alone, TOY, 0)
    assert _decode_s(together, TOY, 0) == pytest.approx(base)  # no sharing in the profile
    assert _decode_s(alone, shared, 0) == pytest.approx(base)  # nobody else busy
    assert _decode_s(together, shared, 0) == pytest.approx(1.5 * base, rel=1e-6)
    faster = dataclasses.replace(TOY, path_step_factor=0.8)
    assert _decode_s(alone, faster, 0) == pytest.approx(0.8 * base, rel=1e-6)


def test_host_samples_are_live_over_replayed_time_per_token() -> None:
    cfg = ReplicaConfig(TOY, kv_capacity_tokens=8192)
    turns = [_turn(0.0, 1.0, 0, output=64), _turn(0.0, 0.5, 1, output=64), _turn(3.0, 1, 1, 4)]
    got = host_samples(turns, cfg, replicas=2)
    assert len(got) == 2  # 4 output tokens: too few to time
    replayed = _decode_s(turns, TOY, 0)
    assert got[0].ratio == pytest.approx((1.0 - 0.01) / replayed)
    assert got[0].busy_others == pytest.approx((0.5 - 0.01) / (1.0 - 0.01))
    assert got[1].busy_others == pytest.approx(1.0)


def test_the_sharing_round_trips_through_the_profile_file(tmp_path: Path) -> None:
    path = fit_path_delay([PathSample(0, 0.01)] * 12)
    path = dataclasses.replace(path, host=HostFit(0.9, 0.4, True, 120, ((0.5, 120, 1.1),)))
    result = _result().with_path(path)
    pf = load_profile_file(write_profile(result, tmp_path / "profile.toml"))
    assert pf.profile == result.profile
    assert pf.profile.path_step_factor == 0.9 and pf.profile.peer_busy_slowdown == 0.4
    assert pf.profile.host_factor(1) == pytest.approx(0.9 * 1.4)
    assert pf.calibration["path"]["host"]["samples"] == 120


@pytest.mark.parametrize(("key", "value"), [("path_step_factor", 0), ("peer_busy_slowdown", -1)])
def test_a_bad_sharing_field_is_named(tmp_path: Path, key: str, value: float) -> None:
    f = tmp_path / "p.toml"
    f.write_text(f'[profiles.x]\nbase = "toy-8b-h100-tp1"\n{key} = {value}\n')
    with pytest.raises(ConfigError, match=key):
        load_profile_file(f)


def _itl_p50(tmp_path: Path, name: str, c0: float, k: float, sessions: int) -> float:
    path = fit_path_delay([PathSample(0, 0.0)] * 12)
    path = dataclasses.replace(path, host=HostFit(c0, k, k > 0, 12, ()))
    profile = write_profile(_result().with_path(path), tmp_path / f"{name}.toml")
    options = "first_p50 = 200\nfirst_p90 = 400\noutput_p50 = 64\noutput_p90 = 128"
    metrics = simulate_one_turn(tmp_path, profile, sessions, options, "round_robin")
    return float(metrics["itl_s"]["p50"])


def test_the_simulator_slows_replicas_while_others_are_busy(tmp_path: Path) -> None:
    """One request alone: only the path's factor counts. Two sent together to the two
    replicas (round robin): each decodes twice as slowly while the other is busy (the one
    that finishes last, alone for the rest of its decode, less)."""
    alone = _itl_p50(tmp_path, "alone", 1.0, 0.0, 1)
    assert _itl_p50(tmp_path, "alone-shared", 1.0, 1.0, 1) == pytest.approx(alone)
    assert _itl_p50(tmp_path, "alone-path", 1.5, 0.0, 1) == pytest.approx(1.5 * alone)
    pair = _itl_p50(tmp_path, "pair", 1.0, 0.0, 2)
    shared = _itl_p50(tmp_path, "pair-shared", 1.0, 1.0, 2)
    assert 1.5 * pair < shared <= 2 * pair * (1 + 1e-9)


def test_a_slow_fault_and_the_host_factor_multiply() -> None:
    rep = SimReplica(0, "http://r0", ReplicaConfig(dataclasses.replace(TOY, path_step_factor=2.0)))
    assert rep.host_factor == 2.0
    assert rep.engine is not None and rep.engine.config.slowdown == 2.0
    rep.set_slowdown(3.0, 0.0)
    assert rep.engine.config.slowdown == 6.0
    rep.set_host_factor(1.0, 0.0)
    assert rep.engine.config.slowdown == 3.0 and rep.config.slowdown == 3.0
    rep.fail()
    rep.restart()
    assert rep.engine is not None and rep.engine.config.slowdown == 3.0
