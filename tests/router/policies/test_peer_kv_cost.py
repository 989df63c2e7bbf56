"""``kv_cost`` (Dynamo): overlap-weighted prefill blocks + active blocks, the cache views,
temperature, busy threshold."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from sessionroute.clock import ManualClock
from sessionroute.errors import ConfigError
from sessionroute.router.admission import Ticket
from sessionroute.router.kv import KvIndex
from sessionroute.router.policies import create_policy
from sessionroute.router.policies.kv_cost import KvCostPolicy

from .conftest import A, B, gauges, make_core, req


def test_cost_is_prefill_blocks_plus_active_blocks() -> None:
    """cost = (pending prefill + uncached prompt) / block + (in-flight prompt + prompt) / block,
    in 16-token blocks, with the router's own trees (no KV events)."""
    core = make_core("kv_cost")
    first = core.route(req(range(10)))  # a tie (20 blocks each): A
    assert first.worker == A
    policy = core.policy
    assert isinstance(policy, KvCostPolicy)
    # 11 blocks: A holds 10 and has 10 pending + 10 active -> (10 + 1) + (10 + 11) = 32;
    # B: 11 to prefill + 11 active = 22
    assert policy.costs(req(range(11)), [A, B], core.cluster) == [32.0, 22.0]
    core.complete(first)  # A: nothing pending or active any more
    assert policy.costs(req(range(11)), [A, B], core.cluster) == [12.0, 22.0]
    assert policy.costs(req(range(20, 31)), [A, B], core.cluster) == [22.0, 22.0]


@pytest.mark.parametrize(("weight", "expected"), [(2.0, A), (1.0, B), (0.5, B)])
def test_overlap_weight(weight: float, expected: str) -> None:
    """A holds 10 of 11 blocks and has 10 blocks active (reserved by another router, nothing
    pending here): cost A = w * 1 + 10 + 11, B = w * 11 + 11. Weight 2: 23 vs 33 -> A;
    1: 22 vs 22, a tie -> B (never chosen); 0.5: 21.5 vs 16.5 -> B."""
    core = make_core("kv_cost", {"overlap_weight": weight})
    core.complete(core.route(req(range(10))))
    core.cluster.reserve(A, 160)
    assert core.route(req(range(11))).worker == expected


def test_pending_prefill_counts_until_completion() -> None:
    """Two cold 10-block prompts in flight on A (20 pending, 20 active) and one on B: a third
    cold prompt costs A 10 + 20 + 10 + 20 = 60 against B's 40; after both of A's complete, A
    costs 20 against B's 40."""
    core = make_core("kv_cost")
    r1 = core.route(req(range(10)))
    r2 = core.route(req(range(10, 20)))
    r3 = core.route(req(range(20, 30)))
    assert [r1.worker, r2.worker, r3.worker] == [A, B, A]
    assert core.route(req(range(30, 40))).worker == B
    core.complete(r1)
    core.complete(r3)
    policy = core.policy
    assert isinstance(policy, KvCostPolicy)
    assert policy.costs(req(range(40, 50)), [A, B], core.cluster) == [20.0, 60.0]


def test_lowest_cost_follows_the_cache_when_load_is_equal() -> None:
    core = make_core("kv_cost")
    core.complete(core.route(req(range(10))))  # A holds 0..9, nothing in flight
    core.complete(core.route(req(range(50, 60))))  # B: 20 vs 20 -> tie -> B (never chosen)
    got = []
    for i in range(3):  # each completes before the next: A 1 + 11 beats B 11 + 11
        res = core.route(req([*range(10), 100 + i]))
        got.append(res.worker)
        core.complete(res)
    assert got == [A, A, A]
    held = core.route(req([*range(10), 200]))  # in flight on A: then A = 2 + 22 > B = 22
    assert held.worker == A
    assert core.route(req([*range(10), 201])).worker == B


def test_kv_events_replace_the_routers_own_trees() -> None:
    """Once serve's KV-event index tracks the workers, the overlap is what the engines
    reported: B caches the prefix although the router never sent it there, and A, which the
    router sent it to, caches nothing."""
    core = make_core("kv_cost")
    policy = core.policy
    assert isinstance(policy, KvCostPolicy)
    core.complete(core.route(req(range(10))))  # A, before any event
    policy.index.add_worker(A)
    policy.index.add_worker(B)
    policy.index.store(B, range(10))
    assert policy.costs(req(range(11)), [A, B], core.cluster) == [22.0, 12.0]
    assert core.route(req(range(11))).worker == B
    assert policy.approx.size(B) == 0  # the router's own trees are no longer fed


def test_a_driver_view_is_asked_instead() -> None:
    """The simulator hands the replicas' exact caches over :meth:`use_prefix_cache` (here a
    second index standing in for them); the salt travels with the question."""
    core = make_core("kv_cost")
    policy = core.policy
    assert isinstance(policy, KvCostPolicy)
    exact = KvIndex()
    exact.add_worker(B)
    exact.store(B, range(10))
    policy.use_prefix_cache(exact)
    assert core.route(req(range(11))).worker == B
    assert policy.decisions == {"cache_hit": 1, "no_match": 0}


@pytest.mark.parametrize(("temperature", "a_share"), [(0.0, 0.0), (1.0, 0.27)])
def test_temperature_samples_by_softmax_over_normalised_cost(
    temperature: float, a_share: float
) -> None:
    """A carries 100 blocks in flight, B none, one-block requests without content (each
    completes before the next): cost 102 vs 2; the softmax at temperature 1 over cost / max
    gives A exp(-100 / 102) / (1 + exp(-100 / 102)) = 0.27."""
    core = make_core("kv_cost", {"temperature": temperature}, seed=3)
    core.cluster.reserve(A, 1600)
    picks: Counter[str] = Counter()
    for _ in range(4000):
        res = core.route(req(tokens=16))
        picks[res.worker] += 1
        core.complete(res)
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
        {"max_blocks_per_worker": 0},
    ],
)
def test_bad_options_are_named(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        create_policy("kv_cost", bad, clock=ManualClock())
