"""``least_token_load`` (SMG least_load): token work over throughput, since-poll credit, KV
barrier, fallbacks without gauges, waiting cap."""

from __future__ import annotations

from typing import Any

import pytest

from sessionroute.clock import ManualClock
from sessionroute.errors import ConfigError
from sessionroute.router.core import RoutingCore
from sessionroute.router.policies import create_policy
from sessionroute.router.policies.least_token_load import LeastTokenLoadPolicy

from .conftest import A, B, gauges, make_core, req


def _cost(core: RoutingCore, url: str) -> float:
    assert isinstance(core.policy, LeastTokenLoadPolicy)
    return core.policy.cost(url, core.cluster)


def test_since_poll_credit_spreads_requests_between_polls() -> None:
    """Equal gauges, no new poll: each dispatch adds its tokens to the worker's credit, so
    requests alternate instead of herding onto the worker the last poll called idle."""
    core = make_core("least_token_load", {"tokens_per_s": 1000.0})
    gauges(core, A, 0.5)
    gauges(core, B, 0.5)
    got = [core.route(req(tokens=100)).worker for _ in range(4)]
    assert got == [A, B, A, B]
    assert _cost(core, A) == pytest.approx(0.2 + 0.15)  # 200 tokens / 1000 + 0.15 * 1


def test_a_new_poll_resets_the_credit_and_reads_the_queue() -> None:
    """A new poll of A (3 waiting, 2 in flight of 300 tokens in all): queued = 3 x 150."""
    core = make_core("least_token_load", {"tokens_per_s": 1000.0, "kv_penalty_s": 0.0})
    gauges(core, A, 0.0)
    gauges(core, B, 0.0)
    core.route(req(tokens=100))  # A
    core.route(req(tokens=100))  # B
    core.route(req(tokens=200))  # A: credit 300
    assert _cost(core, A) == pytest.approx(0.3)
    gauges(core, A, 0.0, waiting=3)
    assert _cost(core, A) == pytest.approx(3 * 150 / 1000)


@pytest.mark.parametrize(("penalty", "expected"), [(0.15, [B, B, B, A]), (0.0, [A, B, A, B])])
def test_kv_fill_penalty(penalty: float, expected: list[str]) -> None:
    """A's KV at 0.9 costs 0.15 * 9 = 1.35 s, B's at 0.5 costs 0.15 s: B takes 500-token
    requests (0.5 s each) until its cost passes A's."""
    core = make_core("least_token_load", {"tokens_per_s": 1000.0, "kv_penalty_s": penalty})
    gauges(core, A, 0.9)
    gauges(core, B, 0.5)
    assert [core.route(req(tokens=500)).worker for _ in range(4)] == expected


@pytest.mark.parametrize(("max_kv", "cost"), [(None, 0.15 * 999), (0.99, 0.15 * 99), (0.5, 0.15)])
def test_kv_usage_is_clamped_before_the_penalty(max_kv: float | None, cost: float) -> None:
    """SMG clamps k to 0.999 (default): KV usage 1.0 costs 0.15 * 0.999 / 0.001 s."""
    core = make_core("least_token_load", {} if max_kv is None else {"max_kv": max_kv})
    gauges(core, A, 1.0)
    assert _cost(core, A) == pytest.approx(cost)


def test_defaults_are_smgs() -> None:
    """2,000 tok/s fallback throughput: a 1,000-token credit is 0.5 s."""
    core = make_core("least_token_load")
    gauges(core, A, 0.0)
    gauges(core, B, 0.0)
    assert core.route(req(tokens=1000)).worker == A
    assert _cost(core, A) == pytest.approx(0.5)


def test_without_any_gauges_it_is_join_shortest_queue() -> None:
    """No worker reports: the score is the in-flight request count, not tokens."""
    core = make_core("least_token_load")
    first = core.route(req(tokens=40_000))
    assert first.worker == A and _cost(core, A) == 1.0
    second = core.route(req(tokens=10))
    assert second.worker == B
    core.complete(second)
    assert core.route(req(tokens=10)).worker == B  # 1 vs 0 requests, whatever their size


@pytest.mark.parametrize(("mean_prefill", "expected"), [(1024, A), (10, B)])
def test_a_worker_without_gauges_counts_mean_prefill_per_request(
    mean_prefill: int, expected: str
) -> None:
    """B has not reported yet while A has: B's 2 requests count 2 x mean_prefill tokens at the
    throughput (2 x 1024 / 2000 = 1.02 s, or 0.01 s), against A's KV barrier of 0.15 s."""
    core = make_core("least_token_load", {"mean_prefill_tokens": mean_prefill})
    core.cluster.reserve(B, 50)
    core.cluster.reserve(B, 50)
    gauges(core, A, 0.5)
    assert core.route(req(tokens=10)).worker == expected


@pytest.mark.parametrize(("b_waiting", "admitted"), [(3, False), (2, True)])
def test_waiting_cap_holds_requests_when_every_worker_is_at_it(
    b_waiting: int, admitted: bool
) -> None:
    core = make_core("least_token_load", {"max_waiting": 3})
    gauges(core, A, 0.5, waiting=3)
    gauges(core, B, 0.5, waiting=b_waiting)
    placed = core.place(req(tokens=10), lambda t: None)
    assert (not hasattr(placed, "waiting")) is admitted
    if not admitted:
        gauges(core, B, 0.5, waiting=0)  # the next scrape frees B: the queue is pumped
        assert len(core.admission) == 0
        assert core.cluster.in_flight(A) + core.cluster.in_flight(B) == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"tokens_per_s": 0.0},
        {"kv_penalty_s": -1.0},
        {"max_kv": 1.0},
        {"mean_prefill_tokens": 0},
        {"max_waiting": 0},
    ],
)
def test_bad_options_are_named(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        create_policy("least_token_load", bad, clock=ManualClock())
