"""Exact-sequence tests of round_robin, random, power_of_two and least_loaded."""

from __future__ import annotations

import random

import pytest

from sessionroute.clock import ManualClock
from sessionroute.errors import NoWorkerAvailable
from sessionroute.router.core import RoutingCore
from sessionroute.router.policies import create_policy
from sessionroute.router.state import Cluster
from sessionroute.types import DecisionKind, RouteRequest

W = ["http://w1", "http://w2", "http://w3"]


def _core(name: str, rng: random.Random | None = None, urls: list[str] = W) -> RoutingCore:
    return RoutingCore(create_policy(name, clock=ManualClock(), rng=rng), Cluster(urls))


def _short(url: str) -> str:
    return url.removeprefix("http://")


class ScriptedRandom(random.Random):
    """A ``random.Random`` whose ``randrange`` returns scripted values (checked in range)."""

    def __init__(self, values: list[int]) -> None:
        super().__init__(0)
        self.values = list(values)
        self.calls: list[int] = []

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        n = start if stop is None else stop - start
        v = self.values.pop(0)
        if not 0 <= v < n:
            raise AssertionError(f"scripted value {v} out of range({n})")
        self.calls.append(n)
        return v


def test_round_robin_cycles_and_follows_health() -> None:
    core = _core("round_robin")
    got = [_short(core.route(RouteRequest(session_id="s")).worker) for _ in range(4)]
    assert got == ["w1", "w2", "w3", "w1"]
    core.set_health(W[1], False)  # counter is 4: healthy (w1, w3) -> 4 % 2 = 0
    got = [_short(core.route(RouteRequest()).worker) for _ in range(3)]
    assert got == ["w1", "w3", "w1"]
    assert core.decisions[DecisionKind.STATELESS] == 7
    assert core.policy.session_counts() == {}


def test_round_robin_without_workers_raises() -> None:
    core = _core("round_robin")
    for w in W:
        core.set_health(w, False)
    with pytest.raises(NoWorkerAvailable):
        core.route(RouteRequest())


def test_random_uses_the_injected_generator() -> None:
    expected_rng = random.Random(7)
    expected = [W[expected_rng.randrange(3)] for _ in range(40)]
    core = _core("random", rng=random.Random(7))
    assert [core.route(RouteRequest()).worker for _ in range(40)] == expected
    other = _core("random", rng=random.Random(8))
    assert [other.route(RouteRequest()).worker for _ in range(40)] != expected


def test_random_seed_option_is_reproducible() -> None:
    a = RoutingCore(create_policy("random", clock=ManualClock(), seed=3), Cluster(W))
    b = RoutingCore(create_policy("random", clock=ManualClock(), seed=3), Cluster(W))
    assert [a.route(RouteRequest()).worker for _ in range(20)] == [
        b.route(RouteRequest()).worker for _ in range(20)
    ]


def test_power_of_two_samples_two_distinct_and_fewer_in_flight_wins() -> None:
    # randrange(3) -> 1 (w2), randrange(2) -> 1 -> j = 2 (w3): w3 idle, w2 busy.
    rng = ScriptedRandom([1, 1, 0, 0, 2, 1])
    core = _core("power_of_two", rng=rng)
    core.cluster.reserve(W[1], 0)
    assert core.route(RouteRequest()).worker == W[2]
    # randrange(3) -> 0 (w1), randrange(2) -> 0 -> j = 1 (w2): w1 0, w2 1 in flight.
    assert core.route(RouteRequest()).worker == W[0]
    # randrange(3) -> 2 (w3), randrange(2) -> 1 -> j = 1 (w2): w3 has 1 (first pick), w2 1:
    # a tie; w2 was never chosen, so it is the less recently chosen.
    assert core.route(RouteRequest()).worker == W[1]
    assert rng.calls == [3, 2, 3, 2, 3, 2]


def test_power_of_two_tie_goes_to_least_recently_chosen() -> None:
    rng = ScriptedRandom([0, 0] * 4)  # always the pair (w1, w2), both idle
    core = _core("power_of_two", rng=rng)
    got: list[str] = []
    for _ in range(4):
        res = core.route(RouteRequest())
        got.append(_short(res.worker))
        core.complete(res)
    assert got == ["w1", "w2", "w1", "w2"]


def test_power_of_two_single_worker_draws_nothing() -> None:
    rng = ScriptedRandom([])
    core = _core("power_of_two", rng=rng, urls=["http://only"])
    assert core.route(RouteRequest()).worker == "http://only"
    assert rng.calls == []


def test_power_of_two_never_picks_the_most_loaded_of_three() -> None:
    core = _core("power_of_two", rng=random.Random(1))
    for _ in range(3):
        core.cluster.reserve(W[0], 0)
    core.cluster.reserve(W[2], 0)
    picks: set[str] = set()
    for _ in range(200):
        res = core.route(RouteRequest())
        picks.add(res.worker)
        core.complete(res)
    assert W[0] not in picks
    assert picks == {W[1], W[2]}


def test_least_loaded_exact_sequence() -> None:
    core = _core("least_loaded")
    first = [core.route(RouteRequest(prompt_tokens=5)) for _ in range(3)]
    assert [r.worker for r in first] == W  # idle pool: never-chosen, earlier added first
    core.complete(first[1])  # w2 now has the fewest in flight
    assert core.route(RouteRequest()).worker == W[1]
    # All at 1 in flight again: the least recently chosen is w1.
    assert core.route(RouteRequest()).worker == W[0]
    assert core.cluster.in_flight_tokens(W[0]) == 5
