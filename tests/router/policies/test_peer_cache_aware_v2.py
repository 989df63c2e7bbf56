"""``cache_aware_v2`` (SMG): KV overload / spread exits, decayed scores, holders, spill."""

from __future__ import annotations

from typing import Any

import pytest

from sessionroute.clock import ManualClock
from sessionroute.errors import ConfigError
from sessionroute.router.core import RoutingCore
from sessionroute.router.policies import create_policy
from sessionroute.router.policies.cache_aware_v2 import CacheAwareV2Policy

from .conftest import A, B, C, gauges, make_core, req


def _decisions(core: RoutingCore) -> dict[str, int]:
    assert isinstance(core.policy, CacheAwareV2Policy)
    return {k: v for k, v in core.policy.decisions.items() if v}


def _warm(core: RoutingCore) -> None:
    """A holds blocks 0..9 (request completed); B holds nothing; B has one request in flight
    so that A is the least loaded."""
    core.complete(core.route(req(range(10))))
    assert core.cluster.in_flight(A) == 0
    core.cluster.reserve(B, 10)


@pytest.mark.parametrize(
    ("threshold", "expected", "path"), [(0.9, B, "kv_overload"), (0.95, A, "cache_hit")]
)
def test_kv_overload_threshold(threshold: float, expected: str, path: str) -> None:
    """Hottest KV usage 0.92: at 0.9 the request leaves affinity for the least loaded (B after
    A took one more), at 0.95 it stays on the prefix holder A."""
    core = make_core("cache_aware_v2", {"kv_overload_threshold": threshold})
    core.complete(core.route(req(range(10))))  # A holds the prefix
    core.cluster.reserve(A, 10)  # A is busier than B
    gauges(core, A, 0.92)
    gauges(core, B, 0.85)
    assert core.route(req(range(12))).worker == expected
    assert _decisions(core).get(path) == 1


@pytest.mark.parametrize(
    ("spread", "expected", "path"), [(0.3, B, "kv_spread"), (0.6, A, "cache_hit")]
)
def test_kv_spread_threshold(spread: float, expected: str, path: str) -> None:
    core = make_core("cache_aware_v2", {"kv_spread_threshold": spread})
    core.complete(core.route(req(range(10))))
    core.cluster.reserve(A, 10)
    gauges(core, A, 0.7)
    gauges(core, B, 0.2)  # spread 0.5
    assert core.route(req(range(12))).worker == expected
    assert _decisions(core).get(path) == 1


def test_spread_needs_every_worker_scraped() -> None:
    core = make_core("cache_aware_v2")
    core.complete(core.route(req(range(10))))
    core.cluster.reserve(A, 10)
    gauges(core, A, 0.7)  # B not scraped yet
    assert core.route(req(range(12))).worker == A


@pytest.mark.parametrize(
    ("decay", "expected", "path"), [(8192.0, A, "cache_hit"), (100.0, B, "smallest_tree")]
)
def test_cache_score_decays_with_waiting_prefill(decay: float, expected: str, path: str) -> None:
    """A holds 10 of 12 blocks (0.83) with 1,000 uncached tokens waiting: the score is
    0.83 / (1 + 1000/8192) = 0.74 > 0.3 with the default scale, 0.83 / 11 = 0.08 with 100."""
    core = make_core("cache_aware_v2", {"decay_tokens": decay})
    core.route(req(range(10), tokens=1000))  # in flight on A: 1,000 uncached tokens
    got = core.route(req(range(12)))
    assert got.worker == expected
    assert _decisions(core).get(path) == (2 if path == "smallest_tree" else 1)


def test_least_loaded_among_prefix_holders() -> None:
    """Both A and B hold the prefix (B learnt it through a spill): each request for it goes to
    the less loaded holder; C, without it, gets nothing."""
    core = make_core("cache_aware_v2", {"spill_abs": 0.0, "spill_rel": 1.0}, workers=(A, B, C))
    r1 = core.route(req(range(10)))  # smallest tree: A
    r2 = core.route(req(range(10)))  # holder A, but 1 > mean 0.33: spills to B (least loaded)
    assert (r1.worker, r2.worker) == (A, B)
    core.complete(r1)
    core.complete(r2)
    core.cluster.reserve(A, 0)
    core.cluster.reserve(A, 0)
    assert core.route(req(range(12))).worker == B  # holders A (2), B (0)
    for _ in range(3):
        core.cluster.reserve(B, 0)
    assert core.route(req(range(12))).worker == A  # holders A (2), B (4)
    assert _decisions(core) == {"smallest_tree": 1, "spill": 1, "cache_hit": 2}
    assert core.cluster.in_flight(C) == 0


def test_hot_prefix_spreads_by_the_imbalance_trigger() -> None:
    core = make_core("cache_aware_v2", {"balance_abs_threshold": 0, "balance_rel_threshold": 0.0})
    r1 = core.route(req(range(10)))
    r2 = core.route(req(range(10)))  # imbalance (1 vs 0): least loaded B
    assert (r1.worker, r2.worker) == (A, B)
    assert _decisions(core) == {"smallest_tree": 1, "imbalance": 1}


@pytest.mark.parametrize(("spill_abs", "sixth"), [(2.0, B), (64.0, A)])
def test_per_request_spill_gate(spill_abs: float, sixth: str) -> None:
    """Six requests for one prefix held by A: the sixth finds A at 5 in flight, mean 2.5 —
    over 1.5 x mean (3.75) and, with spill_abs 2, over mean + 2 (4.5): it spills to B."""
    core = make_core("cache_aware_v2", {"spill_abs": spill_abs})
    got = [core.route(req(range(10))).worker for _ in range(6)]
    assert got == [A, A, A, A, A, sixth]
    if sixth == B:
        assert _decisions(core)["spill"] == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"cache_threshold": 2.0},
        {"kv_overload_threshold": -0.1},
        {"kv_spread_threshold": 1.1},
        {"spill_rel": -1.0},
        {"decay_tokens": 0.0},
        {"max_tree_blocks": 0},
    ],
)
def test_bad_options_are_named(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        create_policy("cache_aware_v2", bad, clock=ManualClock())
