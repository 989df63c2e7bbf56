"""``kv_cost`` (Dynamo): overlap-weighted prefill blocks + decode blocks, temperature, busy."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from sessionroute.clock import ManualClock
from sessionroute.errors import ConfigError
from sessionroute.router.admission import Ticket
from sessionroute.router.policies import create_policy
from sessionroute.router.policies.kv_cost import KvCostPolicy

from .conftest import A, B, gauges, make_core, req


def test_cost_is_blocks_to_prefill_plus_blocks_in_flight() -> None:
    core = make_core("kv_cost")
    first = core.route(req(range(10)))  # 160 tokens in flight on A = 10 blocks
    assert first.worker == A
    policy = core.policy
    assert isinstance(policy, KvCostPolicy)
    # 11 blocks: A holds 10 -> 1 to prefill + 10 decode; B: 11 to prefill + 0
    assert policy.costs(req(range(11)), [A, B], core.cluster) == [11.0, 11.0]
    assert policy.costs(req(range(20, 31)), [A, B], core.cluster) == [21.0, 11.0]


@pytest.mark.parametrize(("weight", "expected"), [(2.0, A), (1.0, B), (0.5, B)])
def test_overlap_weight(weight: float, expected: str) -> None:
    """A holds 10 of 11 blocks and has 10 in flight: cost A = w * 1 + 10, B = w * 11.
    Weight 2: 12 vs 22 -> A; 1: 11 vs 11, a tie -> B (never chosen); 0.5: 10.5 vs 5.5 -> B."""
    core = make_core("kv_cost", {"overlap_weight": weight})
    assert core.route(req(range(10))).worker == A
    assert core.route(req(range(11))).worker == expected


def test_lowest_cost_follows_the_cache_when_load_is_equal() -> None:
    core = make_core("kv_cost")
    core.complete(core.route(req(range(10))))  # A holds 0..9, nothing in flight
    core.complete(core.route(req(range(50, 60))))  # B: 10 vs 10 -> tie -> B (never chosen)
    got = []
    for i in range(3):  # each completes before the next: A's 1 block to prefill beats B's 11
        res = core.route(req([*range(10), 100 + i]))
        got.append(res.worker)
        core.complete(res)
    assert got == [A, A, A]
    held = core.route(req([*range(10), 200]))  # in flight: A = 1 + 11 > B = 11 + 0
    assert held.worker == A
    assert core.route(req([*range(10), 201])).worker == B


@pytest.mark.parametrize(("temperature", "a_share"), [(0.0, 0.0), (1.0, 0.27)])
def test_temperature_samples_by_softmax_over_normalised_cost(
    temperature: float, a_share: float
) -> None:
    """A carries 100 blocks in flight, B none, requests have no blocks: cost 100 vs 0; the
    softmax at temperature 1 over cost / max gives A exp(-1) / (1 + exp(-1)) = 0.27."""
    core = make_core("kv_cost", {"temperature": temperature}, seed=3)
    core.cluster.reserve(A, 1600)
    picks = Counter(core.policy.select(req(tokens=16), core.cluster).worker for _ in range(4000))
    assert picks[A] / 4000 == pytest.approx(a_share, abs=0.03)


@pytest.mark.parametrize(("busy", "expected"), [(None, A), (0.9, B)])
def test_busy_threshold_leaves_a_full_worker_out(busy: float | None, expected: str) -> None:
    core = make_core("kv_cost", {"busy_kv_threshold": busy})
    core.complete(core.route(req(range(10))))  # A holds the prefix
    gauges(core, A, 0.95)
    gauges(core, B, 0.5)
    assert core.route(req(range(12))).worker == expected


def test_all_busy_holds_the_request_until_a_scrape_frees_a_worker() -> None:
    core = make_core("kv_cost", {"busy_kv_threshold": 0.9})
    gauges(core, A, 0.95)
    gauges(core, B, 0.92)
    ready: list[Ticket] = []
    held = core.place(req(range(4)), ready.append)
    assert isinstance(held, Ticket) and held.waiting
    gauges(core, B, 0.4)
    assert ready == [held] and held.reservation is not None and held.reservation.worker == B


@pytest.mark.parametrize(
    "bad",
    [
        {"overlap_weight": -1.0},
        {"temperature": -0.5},
        {"busy_kv_threshold": 0.0},
        {"max_tree_blocks": 0},
    ],
)
def test_bad_options_are_named(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        create_policy("kv_cost", bad, clock=ManualClock())
