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
from sessionroute.sim.events import EventQueue
from sessionroute.sim.replicas import SimReplica
from sessionroute.sim.wakeups import ReplicaWakeups

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


def test_short_bins_join_their_neighbour() -> None:
    """A last bin of fewer than 12 requests joins the one before (none lost, none counted
    twice)."""
    for n in (13, 16, 30):
        fit = fit_host(_samples(1.0, 0.5, 0.05, n=n))
        assert sum(c for _, c, _ in fit.bins) == n
        assert all(c >= 12 for _, c, _ in fit.bins)
    assert [c for _, c, _ in fit_host(_samples(1.0, 0.5, 0.05, n=30)).bins] == [12, 18]


def test_no_sharing_is_fitted_from_too_little_or_the_wrong_way() -> None:
    idle = [HostSample(0.0, 1.0)] * 8
    # equal ratios (a median absolute deviation of 0): a hair's difference proves nothing
    assert not fit_host([*idle, *[HostSample(1.0, 1.0 + 1e-9)] * 8]).shared
    # a busy group of 7: too few
    assert not fit_host([*idle, *[HostSample(1.0, 2.0)] * 7]).shared
    # busy faster than idle: no negative slowdown
    fit = fit_host([*idle, *[HostSample(1.0, 0.5)] * 8])
    assert not fit.shared and fit.peer_busy_slowdown == 0.0
    fit = fit_host([*idle, *[HostSample(1.0, 2.0)] * 8], servers=2)
    assert fit.shared and fit.peer_busy_slowdown == pytest.approx(1.0)
    assert fit.as_dict()["servers"] == 2


def test_every_replica_follows_the_others_busy_down_and_hung() -> None:
    """The host factor of each replica counts the others with a request in a running engine;
    a replica down or hung counts for nothing and keeps its factor for its next engine."""
    profile = dataclasses.replace(TOY, peer_busy_slowdown=1.0)
    reps = [SimReplica(i, f"http://r{i}", ReplicaConfig(profile)) for i in range(3)]
    host = ReplicaWakeups(EventQueue(), reps)  # no request in any engine: nothing finishes
    reps[0].inflight["a"] = object()
    reps[1].inflight["b"] = object()
    host.host_changed()
    assert [r.host_factor for r in reps] == [2.0, 2.0, 3.0]
    engine = reps[2].engine
    assert engine is not None and engine.config.slowdown == 3.0
    reps[1].freeze()  # hung: its request waits, its engine runs nothing
    host.host_changed()
    assert [r.host_factor for r in reps] == [1.0, 2.0, 2.0]
    reps[2].fail()
    host.host_changed()
    reps[1].unfreeze()
    reps[1].fail()
    reps[0].inflight.clear()
    host.host_changed()
    assert [r.host_factor for r in reps] == [1.0, 1.0, 1.0]
    reps[0].inflight["c"] = object()
    host.host_changed()
    reps[2].restart()  # a fresh engine starts at the factor of now
    engine = reps[2].engine
    assert engine is not None and engine.config.slowdown == 2.0


def test_the_hit_rate_replay_takes_the_sharing_too() -> None:
    """compare's replay of the live runs (hit rates) slows each server while the other was
    busy, as the probe's replay does: its prefill and the hits it finds are the same model's."""
    from sessionroute.experiments.replay import replay_run

    turns = [_turn(0.0, 1.0, 0, output=64), _turn(0.0, 100.0, 1, output=64)]
    alone = replay_run(turns, ReplicaConfig(TOY, kv_capacity_tokens=8192), replicas=2)
    shared = dataclasses.replace(TOY, peer_busy_slowdown=0.5)
    both = replay_run(turns, ReplicaConfig(shared, kv_capacity_tokens=8192), replicas=2)
    assert both["replay_prefill_mean_s"] == pytest.approx(1.5 * alone["replay_prefill_mean_s"])
    assert both["replay_hit_rate"] == alone["replay_hit_rate"]


def test_a_path_fit_without_sharing_resets_the_profiles_fields() -> None:
    path = fit_path_delay([PathSample(0, 0.01)] * 12)
    shared = _result().with_path(
        dataclasses.replace(path, host=HostFit(0.9, 0.4, True, 120, ((0.5, 120, 1.1),)))
    )
    again = shared.with_path(path)
    assert again.profile.path_step_factor == 1.0 and again.profile.peer_busy_slowdown == 0.0
