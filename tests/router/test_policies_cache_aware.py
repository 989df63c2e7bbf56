"""cache_aware (sglang / vllm-router approximate radix tree) and its radix tree."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionroute.clock import ManualClock
from sessionroute.errors import ConfigError
from sessionroute.router.core import SWEEP_CHUNK, RoutingCore
from sessionroute.router.policies import create_policy
from sessionroute.router.policies._radix import ApproxRadixTree, common_prefix_len
from sessionroute.router.policies.cache_aware import CacheAwarePolicy
from sessionroute.router.state import Cluster
from sessionroute.types import DecisionKind, RouteRequest

W = ["http://w1", "http://w2", "http://w3"]
SYSTEM = "You are a helpful coding agent. " * 2  # 64 characters shared by every prompt


def _core(options: dict[str, Any] | None = None, urls: list[str] = W) -> RoutingCore:
    return RoutingCore(create_policy("cache_aware", options, clock=ManualClock()), Cluster(urls))


def _policy(core: RoutingCore) -> CacheAwarePolicy:
    p = core.policy
    if not isinstance(p, CacheAwarePolicy):
        raise TypeError(type(p))
    return p


def _keys(text: str) -> tuple[int, ...]:
    """Content-block keys standing for ``text``, one per character (so matches and tree sizes
    count characters, as in sglang's character-level tree)."""
    return tuple(ord(c) for c in text)


def _go(core: RoutingCore, text: str | None = None, tokens: list[int] | None = None) -> str:
    blocks = _keys(text) if text is not None else tokens
    res = core.route(RouteRequest(blocks=blocks))
    core.complete(res)
    return res.worker[-2:]


# -- radix tree --------------------------------------------------------------------------------


def test_radix_tree_split_match_and_size() -> None:
    t = ApproxRadixTree()
    for key in ("hello world", "hello there", "help"):
        t.insert(key)
    assert t.size == len("hel") + len("lo ") + len("world") + len("there") + len("p")
    assert len(t) == 5
    assert [t.match(k) for k in ("hello wor", "hello thx", "hex", "zzz", "help me", "")] == [
        9,
        8,
        2,
        0,
        4,
        0,
    ]
    t.insert("hello world")  # already stored: nothing grows
    assert t.size == 17


def test_radix_tree_evicts_least_recent_leaves_first() -> None:
    t = ApproxRadixTree()
    t.insert("hello world")
    t.insert("hello there")
    t.insert("help")
    assert t.evict(8) == 2  # "world" (oldest), then "there"
    assert t.size == 7
    assert (t.match("hello world"), t.match("help"), t.match("hello there")) == (6, 4, 6)
    t.insert("hello there")  # touch the "hello " branch: now "p" is the oldest leaf
    assert t.evict(t.size - 1) == 1
    assert (t.match("help"), t.match("hello there")) == (3, 11)


def test_radix_tree_token_ids() -> None:
    t = ApproxRadixTree()
    t.insert((1, 2, 3, 4))
    t.insert((1, 2, 5))
    assert (t.match((1, 2, 3)), t.match((1, 2, 5, 9)), t.match((2,)), t.size) == (3, 3, 0, 5)


def test_common_prefix_len() -> None:
    assert common_prefix_len("abcdef", "abcxef") == 3
    assert common_prefix_len((1, 2), (1, 2, 3)) == 2
    assert common_prefix_len("", "a") == 0


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.text(alphabet="ab", max_size=12), max_size=12),
    probes=st.lists(st.text(alphabet="ab", max_size=14), max_size=6),
    limit=st.integers(0, 40),
)
def test_radix_tree_against_brute_force(keys: list[str], probes: list[str], limit: int) -> None:
    t = ApproxRadixTree()
    for k in keys:
        t.insert(k)
    for p in [*probes, *keys]:
        assert t.match(p) == max([common_prefix_len(p, k) for k in keys], default=0)
    assert t.size == len(_distinct_prefixes(keys))
    before = {p: t.match(p) for p in probes}
    t.evict(limit)
    assert t.size <= limit
    for p in probes:
        assert t.match(p) <= before[p]  # eviction only forgets


def _distinct_prefixes(keys: list[str]) -> set[str]:
    return {k[:i] for k in keys for i in range(1, len(k) + 1)}


# -- cache_aware policy ------------------------------------------------------------------------


def test_cache_aware_exact_sequence() -> None:
    core = _core()
    policy = _policy(core)
    a = SYSTEM + "task A: fix the parser"
    b = "unrelated prompt about databases"
    assert _go(core, a) == "w1"  # every tree empty: smallest, least recently chosen
    assert _go(core, b) == "w2"  # no match: smallest trees are w2, w3
    assert _go(core, a + " / turn 2") == "w1"  # match 86 of 96 chars > 0.3
    assert _go(core, "zzz") == "w3"
    # SYSTEM alone is 64 of 69 characters of this prompt, matched by w1 only.
    assert _go(core, SYSTEM + "other") == "w1"
    assert policy.decisions == {"cache_hit": 2, "smallest_tree": 3, "load_balance": 0}
    sizes = policy.tree_sizes()
    assert sizes["http://w2"] == len(b) and sizes["http://w3"] == 3


def test_cache_aware_low_match_goes_to_smallest_tree() -> None:
    core = _core()
    assert _go(core, "x" * 100) == "w1"
    assert _go(core, "y" * 10) == "w2"
    assert _go(core, "z" * 50) == "w3"
    # 20 of 100 chars match w1 (0.2 <= 0.3): the smallest tree (w2, 10 chars) wins.
    assert _go(core, "x" * 20 + "q" * 80) == "w2"


def test_cache_aware_switches_to_least_loaded_when_imbalanced() -> None:
    core = _core()
    policy = _policy(core)
    held = [core.route(RouteRequest(blocks=_keys("same prompt"))) for _ in range(65)]
    assert {r.worker for r in held} == {"http://w1"}  # 65 in flight on w1, 0 elsewhere
    res = core.route(RouteRequest(blocks=_keys("same prompt")))  # 65 - 0 > 64 and 65 > 0 * 1.5
    assert res.worker == "http://w2"
    assert policy.decisions["load_balance"] == 1
    # The content was inserted into w2's tree even on the load-balance path.
    assert policy.tree("http://w2").match(_keys("same prompt")) == len("same prompt")
    for r in held[:10]:
        core.complete(r)
    # Loads 55, 1, 0 are balanced again; w1 and w2 both match fully, w2 has fewer in flight.
    assert core.route(RouteRequest(blocks=_keys("same prompt"))).worker == "http://w2"
    assert core.route(RouteRequest(blocks=_keys("new prompt"))).worker == "http://w3"


def test_cache_aware_relative_threshold_blocks_rebalancing() -> None:
    core = _core({"balance_abs_threshold": 2, "balance_rel_threshold": 3.0}, urls=W[:2])
    assert _go(core, "p") == "w1"
    for _ in range(5):
        core.cluster.reserve("http://w1", 0)
    for _ in range(2):
        core.cluster.reserve("http://w2", 0)
    # loads 5 and 2: 5 - 2 > 2 but not 5 > 2 * 3.0, so balanced: cache hit on w1.
    assert core.route(RouteRequest(blocks=_keys("p"))).worker == "http://w1"
    # loads 6 and 2: 6 > 6 is false, still balanced.
    assert core.route(RouteRequest(blocks=_keys("p"))).worker == "http://w1"
    # loads 7 and 2: 7 - 2 > 2 and 7 > 6: imbalanced, least loaded.
    assert core.route(RouteRequest(blocks=_keys("p"))).worker == "http://w2"
    assert _policy(core).decisions == {"cache_hit": 2, "smallest_tree": 1, "load_balance": 1}


def test_cache_aware_matches_block_keys() -> None:
    core = _core()
    blocks = list(range(100, 140))
    assert _go(core, tokens=blocks) == "w1"
    assert _go(core, tokens=[7, 8, 9]) == "w2"
    assert _go(core, tokens=[*blocks, 999]) == "w1"
    assert _policy(core).tree_sizes()["http://w1"] == 41


def test_cache_aware_tree_size_is_bounded() -> None:
    core = _core({"max_tree_size": 50}, urls=W[:1])
    policy = _policy(core)
    prompts = [chr(ord("A") + i) * 17 for i in range(20)]  # no shared prefixes
    for p in prompts:
        _go(core, p)
        assert policy.tree_sizes()["http://w1"] <= 50
    tree = policy.tree("http://w1")
    assert [tree.match(_keys(p)) for p in prompts] == [0] * 18 + [17, 17]  # the two newest fit
    assert tree.size == 34


def test_cache_aware_empty_content_removed_worker_and_flags() -> None:
    core = _core()
    policy = _policy(core)
    assert core.route(RouteRequest()).kind is DecisionKind.STATELESS
    assert policy.tree_sizes() == {}
    _go(core, "abc")
    core.remove_worker("http://w2")
    assert "http://w2" not in policy.tree_sizes()
    assert CacheAwarePolicy.needs_content is True
    assert CacheAwarePolicy.keeps_sessions is False


def test_a_removed_workers_tree_is_taken_apart_in_the_chunks_of_the_routers_sweep() -> None:
    core = _core(urls=W[:1])
    policy = _policy(core)
    policy.bound_sweeps(SWEEP_CHUNK)  # as serve does
    for i in range(30):
        _go(core, f"{SYSTEM}task {i}")
    core.add_worker(W[1])
    core.remove_worker(W[0])  # O(1): the tree waits for the sweep
    assert policy.sweep_pending() and W[0] not in policy.tree_sizes()
    gc.disable()
    try:
        gc.collect()
        chunks = list(core.sweep_chunks(0.0, 10))
        assert gc.collect() == 0  # every node was freed as it was removed: no cycles left
    finally:
        gc.enable()
    assert len(chunks) > 1 and not policy.sweep_pending()  # bounded chunks (31 nodes), then done


def test_radix_tree_drain_removes_oldest_first_within_the_limit() -> None:
    t = ApproxRadixTree()
    for k in ("abc", "abd", "x"):
        t.insert(_keys(k))
    assert t.drain(2) == 2 and t.match(_keys("x")) == 1 and t.match(_keys("abd")) == 2
    assert t.drain() == 2 and len(t) == 0 and t.size == 0


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"cache_threshold": 1.5}, "1.5"),
        ({"balance_abs_threshold": -1}, "-1"),
        ({"balance_rel_threshold": -0.5}, "-0.5"),
        ({"max_tree_size": 0}, "max_tree_size"),
        ({"eviction_interval_secs": 60}, "eviction_interval_secs"),
    ],
)
def test_cache_aware_bad_options(options: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        create_policy("cache_aware", options, clock=ManualClock())
