"""``cache_aware_v2`` (SMG): KV overload / spread exits, affinity group, decay, spill gate."""

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


@pytest.mark.parametrize(
    ("threshold", "n_blocks", "expected", "path"),
    [(0.3, 30, A, "cache_hit"), (0.34, 30, B, "miss"), (0.5, 20, B, "miss")],
)
def test_cache_threshold(threshold: float, n_blocks: int, expected: str, path: str) -> None:
    """A holds 10 blocks. 10 of 30 (0.33) is above 0.3 but not 0.34; 10 of 20 is not above
    0.5 (strict). A miss goes to the lowest expected wait: both idle, so the least recently
    chosen, B."""
    core = make_core("cache_aware_v2", {"cache_threshold": threshold})
    core.complete(core.route(req(range(10))))
    assert core.route(req(range(n_blocks))).worker == expected
    assert _decisions(core) == {
        "miss": 1 + (path == "miss"),
        **({path: 1} if path != "miss" else {}),
    }


@pytest.mark.parametrize(
    ("threshold", "expected", "path"),
    [(0.9, B, "kv_overload"), (0.92, A, "cache_hit"), (1.0, A, "cache_hit")],
)
def test_kv_overload_threshold(threshold: float, expected: str, path: str) -> None:
    """Hottest KV usage 0.92: above 0.9 affinity is abandoned for the lowest expected wait
    (B: KV barrier 0.15 * 0.85 / 0.15 = 0.85 s against A's 1.725 s); at 0.92 (strict) or 1.0
    (SMG's default, off) the request stays on the prefix holder A."""
    core = make_core("cache_aware_v2", {"kv_overload_threshold": threshold})
    core.complete(core.route(req(range(10))))  # A holds the prefix
    gauges(core, A, 0.92)
    gauges(core, B, 0.85)
    assert core.route(req(range(12))).worker == expected
    assert _decisions(core).get(path) == 1


@pytest.mark.parametrize(
    ("spread", "expected", "path"),
    [(0.4, B, "kv_spread"), (0.5, A, "cache_hit"), (1.0, A, "cache_hit")],
)
def test_kv_spread_threshold(spread: float, expected: str, path: str) -> None:
    """KV usage 0.7 and 0.2: a spread of 0.5 is above 0.4, not above 0.5 or 1.0 (off)."""
    core = make_core("cache_aware_v2", {"kv_spread_threshold": spread})
    core.complete(core.route(req(range(10))))
    gauges(core, A, 0.7)
    gauges(core, B, 0.2)
    assert core.route(req(range(12))).worker == expected
    assert _decisions(core).get(path) == 1


def test_spread_counts_only_workers_with_gauges() -> None:
    """Only A reports (0.7): the spread over the reporting workers is 0."""
    core = make_core("cache_aware_v2", {"kv_spread_threshold": 0.1})
    core.complete(core.route(req(range(10))))
    gauges(core, A, 0.7)
    assert core.route(req(range(12))).worker == A


def test_affinity_group_is_the_holders_of_the_longest_match() -> None:
    """A holds 10 blocks of the prompt, B 5: only A is a candidate, even while B is idle and A
    has a request in flight."""
    core = make_core("cache_aware_v2", workers=(A, B, C))
    core.complete(core.route(req(range(10))))  # A
    core.complete(core.route(req([*range(5), 50])))  # B (A's 5 blocks of 6: hit on A)...
    assert isinstance(core.policy, CacheAwareV2Policy)
    assert core.policy.index.match(A, tuple(range(10))) == 10
    core.route(req(range(20, 30)))  # a miss: in flight on the least recently chosen (B or C)
    got = core.route(req(range(12)))
    assert got.worker == A and core.policy.index.match(B, tuple(range(12))) < 10


def test_expected_wait_among_holders() -> None:
    """A and B both hold the prefix (B learnt it through a spill): the holder with the lower
    expected wait takes each request; C, without the prefix, gets nothing."""
    core = make_core(
        "cache_aware_v2",
        {"balance_abs_threshold": 0.0, "balance_rel_threshold": 1.0},
        workers=(A, B, C),
    )
    r1 = core.route(req(range(10)))  # miss: A
    r2 = core.route(req(range(10)))  # holder A at 1 > mean 0.33: spills to the least loaded
    assert (r1.worker, r2.worker) == (A, B)
    core.complete(r1)
    core.complete(r2)
    gauges(core, A, 0.5)
    gauges(core, B, 0.2)
    gauges(core, C, 0.0)
    core.complete(core.route(req([*range(10), 98])))  # B: barrier 0.0375 s vs A's 0.15 s
    gauges(core, B, 0.8)
    assert core.route(req([*range(10), 99])).worker == A  # 0.15 s vs B's 0.6 s
    assert _decisions(core) == {"miss": 1, "spill": 1, "cache_hit": 2}
    assert core.cluster.in_flight(C) == 0


@pytest.mark.parametrize(("decay", "expected"), [(0.0, A), (0.1, B)])
def test_overlap_decay(decay: float, expected: str) -> None:
    """A and B hold the prefix; A has 1 request waiting of 1,600 uncached tokens (queued
    1,600), B none; one request in flight on each (no spill). Without decay the expected wait
    decides: A 0.8 s (queue) + 0 (KV 0) against B's KV barrier 0.15 * 0.88 / 0.12 = 1.1 s: A.
    With decay 0.1, A's score is 1 / (1 + 0.1 * 1600 / 192) = 0.55 against B's 1: the group
    is B alone."""
    core = make_core(
        "cache_aware_v2",
        {"balance_abs_threshold": 0.0, "balance_rel_threshold": 1.0, "overlap_decay": decay},
    )
    r1 = core.route(req(range(10)))
    r2 = core.route(req(range(10)))  # spill: B learns the prefix
    assert (r1.worker, r2.worker) == (A, B)
    core.complete(r1)
    core.complete(r2)
    r3 = core.route(req(range(200, 210), tokens=1600))  # miss: A (least recently chosen)
    r4 = core.route(req(range(300, 310)))  # miss: B (fewer in flight); loads now equal
    assert (r3.worker, r4.worker) == (A, B)
    gauges(core, A, 0.0, waiting=1)
    gauges(core, B, 0.88)
    assert core.route(req(range(12))).worker == expected


@pytest.mark.parametrize(("balance_abs_threshold", "sixth"), [(2.0, B), (64.0, A)])
def test_balance_abs_threshold(balance_abs_threshold: float, sixth: str) -> None:
    """Six requests for one prefix held by A: the sixth finds A at 5 in flight, mean 2.5 —
    above 1.5 x mean (3.75) and, with an absolute threshold of 2, above mean + 2 (4.5): it
    spills to B."""
    core = make_core("cache_aware_v2", {"balance_abs_threshold": balance_abs_threshold})
    got = [core.route(req(range(10))).worker for _ in range(6)]
    assert got == [A, A, A, A, A, sixth]
    assert _decisions(core).get("spill", 0) == (sixth == B)


@pytest.mark.parametrize(("balance_rel_threshold", "second"), [(1.5, B), (3.0, A)])
def test_balance_rel_threshold(balance_rel_threshold: float, second: str) -> None:
    """With balance_abs_threshold 0, the second request finds A at 1, mean 0.5: above 1.5 x 0.5, not
    above 3 x 0.5."""
    core = make_core(
        "cache_aware_v2",
        {"balance_abs_threshold": 0.0, "balance_rel_threshold": balance_rel_threshold},
    )
    got = [core.route(req(range(10))).worker for _ in range(2)]
    assert got == [A, second]


def test_spill_avoids_other_unsafe_workers() -> None:
    """A holds the prefix and is unsafe; B is unsafe too; the spill goes to C."""
    core = make_core(
        "cache_aware_v2",
        {"balance_abs_threshold": 0.0, "balance_rel_threshold": 1.2},
        workers=(A, B, C),
    )
    core.complete(core.route(req(range(10))))  # A holds it
    for _ in range(3):
        core.cluster.reserve(A, 10)
        core.cluster.reserve(B, 10)
    assert core.route(req(range(10))).worker == C  # mean 2, limit 2.4: A, B at 3


@pytest.mark.parametrize(
    "bad",
    [
        {"cache_threshold": 2.0},
        {"kv_overload_threshold": -0.1},
        {"kv_spread_threshold": 1.1},
        {"balance_rel_threshold": -1.0},
        {"overlap_decay": -0.1},
        {"tokens_per_s": 0.0},
        {"max_tree_blocks": 0},
    ],
)
def test_bad_options_are_named(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        create_policy("cache_aware_v2", bad, clock=ManualClock())
