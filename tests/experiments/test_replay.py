"""The live requests replayed open loop into the simulator's engine (compare --fidelity)."""

from __future__ import annotations

from typing import Any

import pytest

from sessionroute.experiments.replay import replay_run
from sessionroute.replica import PROFILES
from sessionroute.replica.api import ReplicaConfig

TOY = PROFILES["toy-8b-h100-tp1"]


def _turn(sent: float, prompt: int, keys: list[int], cached: int, replica: int = -1) -> Any:
    return {
        "sent_s": sent,
        "replica": replica,
        "prompt_len": prompt,
        "output_len": 8,
        "block_keys": keys,
        "cache_salt": None,
        "cached_tokens": cached,
    }


def test_a_session_hits_its_previous_turn() -> None:
    """Turn 2 extends turn 1's prompt (40) and reply (8): turn 1's KV holds 47 tokens (the last
    reply token is never computed), so 2 full blocks of 16 hit (one replica, no placements
    recorded: it served every turn)."""
    turns = [_turn(0.0, 40, [1, 2, 3], 0), _turn(10.0, 60, [1, 2, 3, 4], 32)]
    r = replay_run(turns, ReplicaConfig(TOY, kv_capacity_tokens=4096))
    assert r["requests"] == 2 and r["skipped"] == 0 and r["same_cached"] == 2
    assert r["live_hit_rate"] == r["replay_hit_rate"] == 32 / 100
    assert r["replay_preemptions"] == 0


def test_the_replay_follows_the_live_send_times() -> None:
    """KV of 4 blocks: another session's 4-block request sent between a session's turns evicts
    that session's blocks; sent after them, it does not. The send times decide the hits."""
    a1, a2 = _turn(0.0, 40, [1, 2, 3], 0), _turn(10.0, 50, [1, 2, 3], 32)
    cfg = ReplicaConfig(TOY, kv_capacity_tokens=64)
    between = replay_run([a1, _turn(5.0, 56, [7, 8, 9, 10], 0), a2], cfg)
    after = replay_run([a1, a2, _turn(15.0, 56, [7, 8, 9, 10], 0)], cfg)
    assert between["replay_hit_rate"] == 0.0 and between["same_cached"] == 2  # live: 32
    assert after["replay_hit_rate"] == 32 / 146 and after["same_cached"] == 3


def test_turns_of_unknown_replica_are_skipped_when_there_are_several() -> None:
    """Without the router naming the worker (e.g. vllm-router) and without taps, no turn's
    replica is known: with 3 replicas nothing is replayed (not all put on one engine)."""
    cfg = ReplicaConfig(TOY, kv_capacity_tokens=4096)
    turns = [_turn(0.0, 40, [1, 2, 3], 0, replica=0), _turn(1.0, 40, [5, 6, 7], 0)]
    r = replay_run(turns, cfg, replicas=3)
    assert r["requests"] == 1 and r["skipped"] == 1
    unknown = replay_run([_turn(0.0, 40, [1, 2, 3], 0), _turn(1.0, 40, [5, 6, 7], 0)], cfg, 3)
    assert unknown["requests"] == 0 and unknown["skipped"] == 2
    assert unknown["replay_hit_rate"] is None


def test_path_samples_are_client_ttft_minus_the_replayed_ttft() -> None:
    """The path probe's delays: each turn's client TTFT minus its TTFT replayed at its send
    time, against the other turns in flight when it was sent."""
    from sessionroute.experiments.live.path_probe import in_flight_at_send, path_samples
    from sessionroute.experiments.replay import replay_ttft

    cfg = ReplicaConfig(TOY, kv_capacity_tokens=4096)
    turns = [
        {**_turn(0.0, 40, [1, 2, 3], 0, replica=0), "latency_s": 1.0, "ttft_s": 0.5},
        {**_turn(0.2, 40, [5, 6, 7], 0, replica=1), "latency_s": 1.0, "ttft_s": 0.5},
        {**_turn(5.0, 40, [8, 9, 10], 0, replica=0), "latency_s": 1.0, "ttft_s": None},
        {**_turn(6.0, 40, [8, 9, 11], 0), "latency_s": 1.0, "ttft_s": 0.5},
    ]
    assert in_flight_at_send(turns) == [0, 1, 0, 0]
    replayed = replay_ttft(turns, cfg, replicas=2)
    assert replayed[3] is None  # unknown replica
    first = replayed[0]
    assert first is not None and 0 < first < 0.5
    samples = path_samples(turns, cfg, replicas=2)
    assert [s.in_flight for s in samples] == [0, 1]  # no first token, unknown replica: left out
    assert samples[0].delay_s == pytest.approx(0.5 - first)


def test_the_path_probe_fits_nothing_without_known_servers() -> None:
    """With several servers and a router that does not name each request's worker, no probe
    request can be replayed: no path delay (not an error after the calibration)."""
    from sessionroute.experiments.live.path_probe import PROBE_LEVELS, probe_path
    from sessionroute.experiments.results import RunOutput
    from sessionroute.experiments.spec import ResolvedArm

    turns = [{**_turn(0.0, 40, [1, 2, 3], 0), "latency_s": 1.0, "ttft_s": 0.5}]
    ran: list[str] = []

    def runner(arm: ResolvedArm, seed: int, progress: Any) -> RunOutput:
        ran.append(arm.name)
        return RunOutput(seed, {"ttft_s": {"mean": 0.5}}, turns=list(turns))

    template = ResolvedArm(name="a", policy="random", policy_options={}, settings={"replicas": {}})
    cfg = ReplicaConfig(TOY, kv_capacity_tokens=4096)
    assert probe_path(runner, template, cfg, replicas=3, say=lambda _l: None) is None
    assert ran == [f"path-probe-{name}" for name, _ in PROBE_LEVELS]
    fit = probe_path(runner, template, cfg, replicas=1, say=lambda _l: None)
    assert fit is not None and fit.samples == len(PROBE_LEVELS)


@pytest.mark.parametrize(
    ("router", "level", "policy"),
    [
        ("sessionroute", "light", "round_robin"),
        ("sessionroute-inprocess", "light", "round_robin"),
        ("vllm-router", "light", "round_robin"),
        (None, "light", "round_robin"),  # no router named: sessionroute's, the default
        # a router of the user's: its policy names unknown
        ("command", "light", "consistent_hash_bounded_load"),
        ("sessionroute", "alone", "consistent_hash_bounded_load"),
        ("sessionroute", "loaded", "consistent_hash_bounded_load"),
        ("sessionroute", "heavy", "consistent_hash_bounded_load"),
    ],
)
def test_the_probe_spreads_its_host_level_whatever_the_arms_policy(
    router: str | None, level: str, policy: str
) -> None:
    """The probe run that measures the servers busy at once routes ``round_robin`` (a
    session-affine first arm put most probe sessions on one server); the others keep the first
    arm's policy and options, and every run keeps its router."""
    from sessionroute.experiments.live.path_probe import PROBE_LEVELS, probe_arm
    from sessionroute.experiments.spec import ResolvedArm
    from sessionroute.router.policies.registry import choose_policy

    template = ResolvedArm(
        name="a",
        policy="consistent_hash_bounded_load",
        policy_options={"c": 1.5},
        settings={"replicas": {}, "live": {} if router is None else {"router": router}},
        objective_options={"x": 1},
    )
    arm = probe_arm(template, level, dict(PROBE_LEVELS)[level])
    assert arm.policy == policy
    assert choose_policy(arm.policy, arm.policy_options).cls.name == policy  # the runner's check
    assert arm.settings["live"].get("router") == router
    assert arm.name == f"path-probe-{level}"
    kept = policy == "consistent_hash_bounded_load"
    assert (arm.policy_options == {"c": 1.5}) is kept
    assert (arm.objective_options == {"x": 1}) is kept
