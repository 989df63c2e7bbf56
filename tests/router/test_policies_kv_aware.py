"""kv_aware: exact sequences on a real KvIndex (the event-fed view) and a recording view."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from sessionroute.clock import ManualClock
from sessionroute.errors import ConfigError, NoWorkerAvailable
from sessionroute.router.core import RoutingCore
from sessionroute.router.policies import create_policy
from sessionroute.router.policies.kv_aware import KvAwareConfig, KvAwarePolicy
from sessionroute.router.state import Cluster
from sessionroute.types import DecisionKind, RouteRequest

W = ["http://a", "http://b", "http://c"]


def _core(**options: float) -> tuple[RoutingCore, KvAwarePolicy]:
    policy = create_policy("kv_aware", options, clock=ManualClock(), rng=random.Random(0))
    assert isinstance(policy, KvAwarePolicy)
    return RoutingCore(policy, Cluster(W)), policy


def _req(blocks: Sequence[int], tokens: int, sid: str | None = None) -> RouteRequest:
    return RouteRequest(session_id=sid, prompt_tokens=tokens, blocks=list(blocks))


def test_holder_keeps_the_prefix_until_its_load_costs_more_than_a_prefill() -> None:
    core, policy = _core(load_tokens_per_request=4096.0)
    prefix = list(range(100, 116))  # 16 blocks
    policy.index.store("http://b", prefix)
    req = _req(prefix, 8192)
    # b: 0 prefill + 4096 * in_flight; a, c: 8192 + 4096 * in_flight
    first = core.route(req)
    assert first.worker == "http://b"  # cost 0 vs 8192
    second = core.route(req)
    assert second.worker == "http://b"  # 4096 < 8192
    third = core.route(req)  # b: 8192, a/c: 8192 -> equal cost, fewer in flight wins
    assert third.worker in ("http://a", "http://c")
    core.complete(first)
    assert core.route(req).worker == "http://b"  # back to 4096 < 8192
    assert policy.decisions == {"cache_hit": 3, "no_match": 1}
    assert policy.matched_blocks_total == 16 * 3


def test_partial_match_is_priced_by_the_unmatched_share() -> None:
    core, policy = _core(load_tokens_per_request=1000.0)
    policy.index.store("http://a", [1, 2, 3, 4])  # holds 4 of 8 blocks
    policy.index.store("http://b", [1, 2])  # holds 2 of 8
    req = _req([1, 2, 3, 4, 5, 6, 7, 8], 8000)
    # a: 4000 + 1000 * load; b: 6000 + 1000 * load; c: 8000 + 1000 * load
    assert [core.route(req).worker for _ in range(6)] == [
        "http://a",  # 4000
        "http://a",  # 5000 < 6000
        "http://b",  # a 6000 = b 6000: fewer in flight (b: 0)
        "http://a",  # a 6000 < b 7000, c 8000
        "http://b",  # a 7000 = b 7000: fewer in flight (b 1 < a 3)
        "http://a",  # a 7000 < b 8000 = c 8000
    ]


def test_without_any_match_it_is_least_loaded_with_content_keyed_ties() -> None:
    core, _ = _core()
    r1 = core.route(_req([7, 8], 32))
    r2 = core.route(_req([7, 8], 32))
    r3 = core.route(_req([7, 8], 32))
    assert {r1.worker, r2.worker, r3.worker} == set(W)  # least loaded spreads a burst
    core.complete(r1)
    core.complete(r2)
    core.complete(r3)
    # an idle pool: the tie goes by the first block hash, the same for equal prefixes
    again = {core.route(_req([7, 9], 32)).worker for _ in range(1)}
    core2, _ = _core()
    assert {core2.route(_req([7, 1, 2], 32)).worker} == again


def test_a_hot_prefix_is_not_sent_everywhere_to_one_worker() -> None:
    core, policy = _core()
    hot = list(range(64))
    policy.index.store("http://a", hot)
    placed = [core.route(_req(hot, 1024)).worker for _ in range(30)]
    counts = {w: placed.count(w) for w in W}
    # a: 1024 * k vs 1024 + 1024 * k elsewhere: a takes one more than the others at most
    assert max(counts.values()) - min(counts.values()) <= 1
    assert counts["http://a"] == max(counts.values())


def test_session_id_keys_the_tie_break_and_salt_reaches_the_view() -> None:
    seen: list[str | None] = []

    class View:
        def matched_blocks(
            self, hashes: Sequence[int], workers: Sequence[str], salt: str | None = None
        ) -> dict[str, int]:
            seen.append(salt)
            return {}

    core, policy = _core()
    policy.use_prefix_cache(View())
    req = RouteRequest(session_id="s1", prompt_tokens=10, blocks=[1], cache_salt="v3")
    res = core.route(req)
    assert res.kind is DecisionKind.STATELESS
    assert seen == ["v3"]
    core.complete(res)
    assert all(core.route(req).worker == res.worker for _ in range(1))
    assert not policy.keeps_sessions and policy.needs_content


def test_no_content_and_no_workers() -> None:
    core, _ = _core()
    assert core.route(RouteRequest(prompt_tokens=5)).worker in W
    empty = RoutingCore(
        create_policy("kv_aware", clock=ManualClock(), rng=random.Random(0)), Cluster([])
    )
    with pytest.raises(NoWorkerAvailable):
        empty.route(RouteRequest())


def test_removed_worker_is_forgotten_by_the_index() -> None:
    core, policy = _core()
    policy.index.store("http://c", [5, 6])
    core.remove_worker("http://c")
    assert policy.index.size("http://c") == 0
    assert core.route(_req([5, 6], 64)).worker in ("http://a", "http://b")


@pytest.mark.parametrize(
    "options", [{"load_tokens_per_request": 0.0}, {"max_blocks_per_worker": 0}]
)
def test_bad_options(options: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        KvAwareConfig(**options)  # type: ignore[arg-type]
