"""Exact-sequence tests of the session policies: sticky_least_loaded, consistent_hash and
consistent_hash_bounded_load (Mirrokni, Thorup, Zadimoghaddam, SODA 2018)."""

from __future__ import annotations

from typing import Any

import pytest

from sessionroute.clock import ManualClock
from sessionroute.errors import ConfigError
from sessionroute.router.core import RoutingCore
from sessionroute.router.policies import create_policy
from sessionroute.router.policies.consistent_hash_bounded_load import (
    ConsistentHashBoundedLoadPolicy,
)
from sessionroute.router.state import Cluster
from sessionroute.types import DecisionKind, RouteRequest

URLS = [f"http://127.0.0.1:1800{i}" for i in (1, 2, 3)]
B = {f"b{i}": u for i, u in enumerate(URLS, start=1)}


def _words(text: str) -> list[str]:
    return text.split()


CH_PLACEMENT = _words(  # shared/ROUTER.md, consistent_hash over b1..b3
    "b2 b2 b2 b2 b2 b3 b3 b3 b3 b3 b3 b1 b1 b3 b2 b1 b3 b3 b3 b3 b1 b3 b1 b2 b1 b1 b2 b2 b1 b2"
)
BOUNDED_125 = _words(
    "b2 b3 b2 b1 b2 b3 b3 b3 b1 b3 b1 b1 b1 b3 b2 b1 b3 b3 b2 b3 b1 b3 b1 b2 b1 b1 b2 b2 b1 b2"
)


def _core(
    name: str, options: dict[str, Any] | None = None, clock: ManualClock | None = None
) -> RoutingCore:
    return RoutingCore(create_policy(name, options, clock=clock or ManualClock()), Cluster(URLS))


def _b(url: str) -> str:
    return "b" + url[-1]


def _route(core: RoutingCore, sid: str | None) -> tuple[str, DecisionKind]:
    res = core.route(RouteRequest(session_id=sid))
    core.complete(res)
    return _b(res.worker), res.kind


def _policy(core: RoutingCore) -> ConsistentHashBoundedLoadPolicy:
    p = core.policy
    if not isinstance(p, ConsistentHashBoundedLoadPolicy):
        raise TypeError(type(p))
    return p


# -- consistent_hash_bounded_load -------------------------------------------------------------


def test_bounded_load_exact_placement_c125() -> None:
    core = _core("consistent_hash_bounded_load")
    assert [_route(core, f"sess-{i}")[0] for i in range(30)] == BOUNDED_125
    assert core.policy.session_counts() == {B["b1"]: 11, B["b2"]: 9, B["b3"]: 10}


@pytest.mark.parametrize("c", [1.0, 1.25, 1.6, 2.0])
def test_bounded_load_walk_equals_ring_without_full_workers(c: float) -> None:
    """Each new session lands where consistent_hash would put it if the full workers
    (``count >= ceil(c * (m + 1) / n)``) were not on the ring."""
    core = _core("consistent_hash_bounded_load", {"c": c})
    policy = _policy(core)
    oracle = _core("consistent_hash")
    for i in range(60):
        counts = policy.session_counts()
        cap = policy.bound(sum(counts.values()) + 1, len(URLS))
        for u in URLS:
            oracle.set_health(u, counts.get(u, 0) < cap)
        expected = oracle.route(RouteRequest(session_id=f"s-{i}")).worker
        assert core.route(RouteRequest(session_id=f"s-{i}")).worker == expected
    assert max(policy.session_counts().values()) <= policy.bound(60, 3)


def test_bounded_load_with_huge_c_is_consistent_hash() -> None:
    core = _core("consistent_hash_bounded_load", {"c": 1e9})
    assert [_route(core, f"sess-{i}")[0] for i in range(30)] == CH_PLACEMENT


def test_bounded_load_c1_is_perfectly_balanced() -> None:
    core = _core("consistent_hash_bounded_load", {"c": 1})
    for i in range(30):
        _route(core, f"sess-{i}")
    assert core.policy.session_counts() == dict.fromkeys(URLS, 10)


def test_bounded_load_moves_a_session_above_the_bound() -> None:
    core = RoutingCore(
        create_policy("consistent_hash_bounded_load", {"c": 1.0}, clock=ManualClock()),
        Cluster(URLS[:2]),
    )
    policy = _policy(core)
    placed = {f"s{i}": _route(core, f"s{i}")[0] for i in range(4)}
    assert sorted(placed.values()) == ["b1", "b1", "b2", "b2"]
    on_b1 = [s for s, w in placed.items() if w == "b1"]
    on_b2 = [s for s, w in placed.items() if w == "b2"]
    for s in on_b1:
        assert core.finish_session(s) is True
    # 2 sessions on 2 workers: bound ceil(1.0 * 2 / 2) = 1; b2 holds 2 > 1.
    assert _route(core, on_b2[0]) == ("b1", DecisionKind.REPINNED)
    assert policy.overload_moves == 1
    assert _route(core, on_b2[1]) == ("b2", DecisionKind.STICKY)
    assert _route(core, on_b2[0]) == ("b1", DecisionKind.STICKY)
    assert policy.session_stats().as_dict() == {
        "new": 4,
        "sticky": 2,
        "repinned": 1,
        "expired": 0,
        "released": 2,
        "evicted": 0,
    }


def test_bounded_load_unhealthy_and_removed_workers() -> None:
    core = _core("consistent_hash_bounded_load")
    assert _route(core, "sess-0") == ("b2", DecisionKind.NEW)
    core.set_health(B["b2"], False)
    moved, kind = _route(core, "sess-0")
    assert kind is DecisionKind.REPINNED and moved != "b2"
    core.set_health(B["b2"], True)
    assert _route(core, "sess-0") == (moved, DecisionKind.STICKY)  # stays after b2 returns
    core.remove_worker(B[moved])
    assert core.policy.session_counts() == {}
    again, kind = _route(core, "sess-0")
    assert kind is DecisionKind.REPINNED and again in {"b1", "b2", "b3"} - {moved}


def test_bounded_load_ttl_release_and_stateless() -> None:
    clock = ManualClock()
    core = _core("consistent_hash_bounded_load", {"session_ttl_s": 10.0}, clock)
    assert _route(core, "a")[1] is DecisionKind.NEW
    clock.advance(9.5)
    assert _route(core, "a")[1] is DecisionKind.STICKY
    clock.advance(10.0)
    assert _route(core, "a")[1] is DecisionKind.NEW
    assert core.policy.session_stats().expired == 1
    assert core.finish_session("a") is True
    assert core.finish_session("a") is False
    assert _route(core, None)[1] is DecisionKind.STATELESS
    assert core.policy.session_counts() == {}
    _route(core, "b")
    clock.advance(100.0)
    assert core.sweep(clock.now()) == 1
    assert core.policy.worker_of("b") is None


@pytest.mark.parametrize(
    ("options", "needle"),
    [({"c": 0.9}, "0.9"), ({"c": float("nan")}, "nan"), ({"sweep_interval_s": -1}, "-1")],
)
def test_bounded_load_bad_options(options: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        create_policy("consistent_hash_bounded_load", options, clock=ManualClock())


def test_bound_is_exact_integer_ceiling() -> None:
    policy = _policy(_core("consistent_hash_bounded_load", {"c": 1.1}))
    assert policy.bound(10, 11) == 1  # 1.1 * 10 / 11 == 1 exactly; floats would give 2
    assert policy.bound(11, 11) == 2
    assert policy.bound(0, 4) == 0
    with pytest.raises(ValueError, match="0"):
        policy.bound(1, 0)


# -- sticky_least_loaded and consistent_hash --------------------------------------------------


def test_sticky_unhealthy_worker_repins_and_stays() -> None:
    core = _core("sticky_least_loaded")
    assert _route(core, "sess-0") == ("b2", DecisionKind.NEW)
    core.set_health(B["b2"], False)
    moved, kind = _route(core, "sess-0")
    assert kind is DecisionKind.REPINNED and moved != "b2"
    core.set_health(B["b2"], True)
    assert _route(core, "sess-0") == (moved, DecisionKind.STICKY)
    stats = core.policy.session_stats()
    assert (stats.new, stats.repinned, stats.sticky) == (1, 1, 1)


def test_sticky_removed_worker_sessions_are_repinned() -> None:
    core = _core("sticky_least_loaded")
    placed = {f"sess-{i}": _route(core, f"sess-{i}")[0] for i in range(6)}
    core.remove_worker(B["b1"])
    assert B["b1"] not in core.policy.session_counts()
    for sid, w in placed.items():
        worker, kind = _route(core, sid)
        if w == "b1":
            assert kind is DecisionKind.REPINNED and worker != "b1"
        else:
            assert (worker, kind) == (w, DecisionKind.STICKY)


def test_sticky_ttl_expiry_on_revisit() -> None:
    clock = ManualClock()
    core = _core("sticky_least_loaded", {"session_ttl_s": 5.0}, clock)
    _route(core, "x")
    clock.advance(5.0)
    assert _route(core, "x")[1] is DecisionKind.NEW
    assert core.policy.session_stats().expired == 1


def test_consistent_hash_stateless_request_goes_by_load() -> None:
    core = _core("consistent_hash")
    first = core.route(RouteRequest())
    second = core.route(RouteRequest())
    assert (first.kind, second.kind) == (DecisionKind.STATELESS, DecisionKind.STATELESS)
    assert first.worker != second.worker  # the second sees the first's reservation
    assert core.policy.session_counts() == {}


@pytest.mark.parametrize("name", ["sticky_least_loaded", "consistent_hash_bounded_load"])
def test_displaced_sessions_are_repinned_only_within_their_ttl(name: str) -> None:
    clock = ManualClock()
    core = _core(name, {"session_ttl_s": 10.0, "sweep_interval_s": 1000.0}, clock)
    placed = {f"s{i}": _route(core, f"s{i}")[0] for i in range(9)}
    gone = max(B, key=lambda b: list(placed.values()).count(b))
    on_gone = sorted(s for s, w in placed.items() if w == gone)
    assert len(on_gone) >= 3
    core.remove_worker(B[gone])
    clock.advance(5.0)
    assert _route(core, on_gone[0])[1] is DecisionKind.REPINNED  # within the TTL
    clock.advance(5.0)  # every other session has now idled 10 s: the TTL
    assert _route(core, on_gone[1])[1] is DecisionKind.NEW
    assert core.policy.session_stats().expired == 1
    # The sweep forgets the other displaced sessions and expires the pinned ones of t = 0.
    assert core.sweep(clock.now()) == (len(on_gone) - 2) + (9 - len(on_gone))
    assert core.policy.session_stats().expired == 8
    assert _route(core, on_gone[2])[1] is DecisionKind.NEW
