"""Several simulated routers (sim/routers.py): per-router state against one shared table."""

from __future__ import annotations

import random

from sessionroute.clock import ManualClock
from sessionroute.router import RoutingCore
from sessionroute.router.policies.adaptive_sticky import AdaptiveStickyPolicy
from sessionroute.router.policies.sticky_least_loaded import StickyLeastLoadedPolicy
from sessionroute.router.state import Cluster
from sessionroute.sim.routers import build_fleet
from sessionroute.types import DecisionKind, RouteRequest

W = ("http://a", "http://b", "http://c")


def _core(state: str) -> RoutingCore:
    clock = ManualClock()
    fleet = build_fleet(
        lambda k: StickyLeastLoadedPolicy(clock=clock, rng=random.Random(k)),
        3,
        state,  # type: ignore[arg-type]
        clock,
    )
    assert fleet.keeps_sessions and fleet.name == "sticky_least_loaded"
    return RoutingCore(fleet, Cluster(W))


def _turns(core: RoutingCore, sessions: int, turns: int) -> dict[str, set[str]]:
    placed: dict[str, set[str]] = {}
    for t in range(turns):
        for k in range(sessions):
            req = RouteRequest(session_id=f"s{k}", request_id=f"s{k}-t{t}", prompt_tokens=5)
            res = core.route(req)
            placed.setdefault(f"s{k}", set()).add(res.worker)
            core.complete(res)
    return placed


def test_shared_state_keeps_every_session_on_one_worker() -> None:
    core = _core("shared")
    placed = _turns(core, 30, 4)
    assert all(len(ws) == 1 for ws in placed.values())
    assert core.decisions[DecisionKind.NEW] == 30
    assert sorted(core.policy.session_counts().values()) == [10, 10, 10]


def test_local_state_places_a_session_again_on_each_router_it_reaches() -> None:
    core = _core("local")
    placed = _turns(core, 30, 4)
    # every session reached more than one router, each of which placed it as new
    assert core.decisions[DecisionKind.NEW] > 30
    assert sum(core.policy.session_counts().values()) == core.decisions[DecisionKind.NEW]
    assert any(len(ws) > 1 for ws in placed.values())


def test_finish_session_reaches_one_router_with_local_state() -> None:
    core = _core("local")
    _turns(core, 10, 3)
    held = sum(core.policy.session_counts().values())
    for k in range(10):
        core.finish_session(f"s{k}")
    left = sum(core.policy.session_counts().values())
    assert 0 < left < held  # the other routers keep their pins until the TTL
    shared = _core("shared")
    _turns(shared, 10, 3)
    for k in range(10):
        shared.finish_session(f"s{k}")
    assert sum(shared.policy.session_counts().values()) == 0


def test_a_fleet_asks_the_reached_router_whether_admission_applies() -> None:
    """adaptive_sticky never holds the next turn of a running session; behind several routers
    (shared table) neither does the fleet, which once said every request was subject to it."""
    clock = ManualClock()
    fleet = build_fleet(
        lambda k: AdaptiveStickyPolicy(clock=clock, rng=random.Random(k)), 3, "shared", clock
    )
    core = RoutingCore(fleet, Cluster(W))
    first = RouteRequest(session_id="s1", request_id="s1-t0", prompt_tokens=5)
    assert fleet.admission_applies(first)  # a new session's first turn may be held
    core.complete(core.route(first))
    for t in range(1, 6):  # whichever router a later turn reaches
        later = RouteRequest(session_id="s1", request_id=f"s1-t{t}", prompt_tokens=5)
        assert not fleet.admission_applies(later)
    assert fleet.admission_applies(RouteRequest(session_id="s2", request_id="s2-t0"))


def test_a_fleet_reads_content_when_its_policies_do_by_their_options() -> None:
    """``adaptive_hold`` with ``short_place = "cache_aware_v2"`` reads prompt content (its
    ``needs_content`` is set per instance); the fleet once took the class's (False), so the
    simulated routers built requests without content keys and the embedded placer saw none."""
    from sessionroute.router.policies._hold_config import AdaptiveHoldConfig
    from sessionroute.router.policies.adaptive_hold import AdaptiveHoldPolicy

    clock = ManualClock()
    for place in ("load", "cache_aware_v2"):
        cfg = AdaptiveHoldConfig(short_turns=3.0, short_place=place)

        def make(k: int, c: AdaptiveHoldConfig = cfg) -> AdaptiveHoldPolicy:
            return AdaptiveHoldPolicy(c, clock=clock, rng=random.Random(k))

        fleet = build_fleet(make, 2, "shared", clock)
        core = RoutingCore(fleet, Cluster(W))
        assert fleet.needs_content is (place == "cache_aware_v2")
        assert core.requests.needs_content is (place == "cache_aware_v2")


def test_a_fleet_keeps_its_policies_admission_settings() -> None:
    """Behind several routers ``adaptive_sticky`` still places a new session held for its own
    ``max_wait_s`` (600 s) at that deadline, and ``adaptive_hold`` still has its held turns
    re-asked every ``hold_check_s``: the fleet once had the base class's (the router's 60 s,
    refused at the deadline; never re-asked by time)."""
    from sessionroute.router.policies._hold_config import AdaptiveHoldConfig
    from sessionroute.router.policies.adaptive_hold import AdaptiveHoldPolicy

    clock = ManualClock()
    sticky = build_fleet(
        lambda k: AdaptiveStickyPolicy(clock=clock, rng=random.Random(k)), 2, "shared", clock
    )
    core = RoutingCore(sticky, Cluster(W))
    assert sticky.places_at_max_wait and core.admission_max_wait_s() == 600.0

    def make(k: int) -> AdaptiveHoldPolicy:
        return AdaptiveHoldPolicy(
            AdaptiveHoldConfig(hold_check_s=2.0), clock=clock, rng=random.Random(k)
        )

    hold = build_fleet(make, 2, "local", clock)
    assert RoutingCore(hold, Cluster(W)).admission_recheck_s == 2.0
