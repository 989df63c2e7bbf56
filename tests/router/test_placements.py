"""Exact vllm-router placements of sess-0..29 over b1..b3 (shared/ROUTER.md)."""

from __future__ import annotations

from sessionroute.clock import ManualClock
from sessionroute.router.core import RoutingCore
from sessionroute.router.policies import create_policy
from sessionroute.router.state import Cluster
from sessionroute.types import RouteRequest

URLS = [f"http://127.0.0.1:1800{i}" for i in (1, 2, 3)]


def _expand(spec: str) -> list[str]:
    out: dict[int, str] = {}
    for part in spec.split():
        ids, worker = part.split(":")
        for chunk in ids.split(","):
            if "-" in chunk:
                lo, hi = chunk.split("-")
                for i in range(int(lo), int(hi) + 1):
                    out[i] = worker
            else:
                out[int(chunk)] = worker
    return [out[i] for i in range(30)]


CONSISTENT = _expand(
    "0-4:b2 5-10:b3 11,12:b1 13:b3 14:b2 15:b1 16-19:b3 20:b1 21:b3 22:b1 23:b2 24,25:b1 "
    "26,27:b2 28:b1 29:b2"
)
STICKY = [
    "b2",
    "b3",
    "b1",
    "b1",
    "b2",
    "b3",
    "b1",
    "b3",
    "b2",
    "b3",
    "b1",
    "b2",
    "b1",
    "b2",
    "b3",
    "b3",
    "b1",
    "b2",
    "b1",
    "b3",
    "b2",
    "b2",
    "b3",
    "b1",
    "b2",
    "b3",
    "b1",
    "b3",
    "b1",
    "b2",
]


def _place(policy: str) -> list[str]:
    core = RoutingCore(create_policy(policy, clock=ManualClock()), Cluster(URLS))
    return ["b" + core.route(RouteRequest(session_id=f"sess-{i}")).worker[-1] for i in range(30)]


def test_consistent_hash_matches_vllm_router() -> None:
    assert _place("consistent_hash") == CONSISTENT


def test_sticky_least_loaded_matches_vllm_router() -> None:
    assert _place("sticky_least_loaded") == STICKY


def test_sixty_concurrent_new_sessions_split_evenly() -> None:
    core = RoutingCore(create_policy("sticky_least_loaded", clock=ManualClock()), Cluster(URLS))
    reservations = [core.route(RouteRequest(session_id=f"c-{i}")) for i in range(60)]
    counts = {u: sum(r.worker == u for r in reservations) for u in URLS}
    assert counts == dict.fromkeys(URLS, 20)


def test_finish_session_frees_capacity() -> None:
    core = RoutingCore(create_policy("sticky_least_loaded", clock=ManualClock()), Cluster(URLS))
    for i in range(30):
        core.route(RouteRequest(session_id=f"sess-{i}"))
    assert core.policy.session_counts() == dict.fromkeys(URLS, 10)
    assert core.finish_session("sess-0") is True
    assert core.finish_session("sess-0") is False
    assert core.route(RouteRequest(session_id="sess-new")).worker == URLS[1]
