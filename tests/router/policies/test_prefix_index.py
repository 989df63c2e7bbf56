"""The peer policies' approximate prefix index: one radix tree whose nodes list workers;
removed workers' entries leave it in the router's chunked sweep."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionroute.clock import ManualClock
from sessionroute.router import RoutingCore, choose_policy
from sessionroute.router.core import SWEEP_CHUNK
from sessionroute.router.policies._prefix import ApproxPrefixIndex
from sessionroute.router.state import Cluster
from sessionroute.types import RouteRequest

A, B, C = "http://a", "http://b", "http://c"


def test_match_counts_the_leading_blocks_each_worker_was_sent() -> None:
    idx = ApproxPrefixIndex(1 << 20)
    idx.record(A, (1, 2, 3, 4))
    idx.record(B, (1, 2, 9))
    assert idx.match(A, (1, 2, 3, 7)) == 3
    assert idx.match(B, (1, 2, 3, 7)) == 2
    assert idx.match(C, (1, 2, 3, 7)) == 0
    assert idx.match_all([A, B, C], (1, 2, 3, 4, 5)) == [4, 2, 0]
    assert idx.match_all([A, B], ()) == [0, 0]
    assert idx.match_all([A, B], (8, 1)) == [0, 0]


def test_record_counts_each_block_once_per_worker() -> None:
    idx = ApproxPrefixIndex(1 << 20)
    idx.record(A, (1, 2, 3))
    idx.record(A, (1, 2, 3, 4, 5))  # a later turn: two new blocks
    idx.record(B, (1, 2))  # splits the edge A's prompts share
    idx.record(A, (1, 2, 7))  # leaves inside it
    assert idx.size(A) == 6 and idx.size(B) == 2
    assert idx.match(A, (1, 2, 3, 4, 5, 6)) == 5 and idx.match(B, (1, 2, 3)) == 2
    assert idx.match_all([A, B], (1, 2, 7, 8)) == [3, 2]


def test_holding_is_one_lookup_in_the_callers_order() -> None:
    idx = ApproxPrefixIndex(1 << 20)
    idx.record(C, (1, 2, 3))
    idx.record(A, (1, 2, 3, 4))
    idx.record(B, (1, 2))
    assert idx.holding([A, B, C], (1, 2, 3, 4), 3) == [A, C]
    assert idx.holding([C, B, A], (1, 2, 3, 4), 2) == [C, B, A]
    assert idx.holding([A, B, C], (1, 2, 3, 4), 4) == [A]


def test_bound_drops_the_least_recently_sent_leaves_and_forget_drops_a_worker() -> None:
    idx = ApproxPrefixIndex(4)
    idx.record(A, (1, 2, 3))
    idx.record(B, (1, 2, 3))
    idx.record(A, (7, 8))  # over A's bound of 4: its oldest leaf (1, 2, 3) goes, for A only
    assert idx.size(A) == 2 and idx.match(A, (1, 2, 3)) == 0 and idx.match(A, (7, 8)) == 2
    assert idx.match(B, (1, 2, 3)) == 3
    idx.record(A, (7, 8, 9, 10))  # 4 blocks: within the bound
    idx.record(A, (1, 2))  # 6: the least recently sent leaf (7, 8)'s tail (9, 10) goes first
    assert idx.size(A) == 4 and idx.match_all([A, B], (7, 8, 9)) == [2, 0]
    assert idx.match(A, (1, 2, 3)) == 2
    idx.forget(A)
    assert idx.size(A) == 0 and idx.match_all([A, B], (1, 2, 3)) == [0, 3]
    idx.forget(B)
    assert idx.holding([A, B], (1, 2), 1) == []


def test_deferred_forgetting_is_immediate_for_lookups_and_tidy_drops_the_entries_in_steps() -> None:
    idx = ApproxPrefixIndex(1 << 20)
    idx.defer_forgetting()  # as serve does (the policies' bound_sweeps)
    for i in range(10):
        idx.record(A, (i, 100 + i, 200 + i))
    idx.record(B, (0, 100))
    idx.forget(A)
    assert idx.pending and idx.size(A) == 0
    assert idx.match_all([A, B], (0, 100, 200)) == [0, 2]
    assert idx.holding([A, B], (3, 103), 1) == [] and idx.matched([A, B], (3,)) == {}
    assert idx.tidy(4) == 4 and idx.pending  # bounded: the rest is left for the next call
    assert idx.tidy() == 7 and not idx.pending  # 10 leaves and the edge B split off
    idx.forget(B)
    idx.tidy()
    assert idx._root.children == {}  # nothing of either worker is left in the tree


def test_without_deferring_forget_drops_the_entries_at_once() -> None:
    idx = ApproxPrefixIndex(1 << 20)
    idx.record(A, (1, 2, 3))
    idx.record(B, (1, 2))
    idx.forget(A)
    assert not idx.pending and idx.tidy() == 0
    idx.forget(B)
    assert idx._root.children == {}


def test_a_worker_back_before_its_entries_are_tidied_is_a_new_tenant() -> None:
    idx = ApproxPrefixIndex(1 << 20)
    idx.defer_forgetting()
    idx.record(A, (1, 2, 3))
    idx.record(B, (1, 2, 3, 4))
    idx.forget(A)
    assert idx.match(A, (1, 2, 3)) == 0  # A came back (same URL): nothing of before counts
    idx.record(A, (1, 2))  # and nothing of before is dropped now: the sweep does it
    assert idx.pending and idx.match_all([A, B], (1, 2, 3, 4)) == [2, 4]
    idx.forget(B)
    idx.record(B, (1, 2))
    assert idx.match_all([A, B], (1, 2, 3, 4)) == [2, 2]
    idx.record(C, (1, 2, 3, 9))  # splits an edge that retired entries are still on
    idx.tidy()
    assert not idx.pending and idx.match_all([A, B, C], (1, 2, 3, 9)) == [2, 2, 4]
    assert idx.size(A) == 2 and idx.size(B) == 2 and idx.size(C) == 4


_PROMPTS = st.lists(st.integers(0, 3), min_size=1, max_size=5).map(tuple)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.sampled_from([A, B, C]), _PROMPTS),
        st.tuples(st.just("forget"), st.sampled_from([A, B, C]), st.just(())),
        st.tuples(st.just("tidy"), st.integers(0, 6), st.just(())),
        st.tuples(st.just("ask"), st.booleans(), _PROMPTS),
    ),
    max_size=40,
)


@pytest.mark.parametrize("defer", [True, False])
@settings(max_examples=300, deadline=None)
@given(ops=_OPS)
def test_every_answer_equals_a_recount_of_the_prompts_each_worker_was_sent(
    defer: bool, ops: list[tuple[Any, Any, tuple[int, ...]]]
) -> None:
    """Whatever the tidying has got to, every answer equals a recount over the prompts sent
    to each worker since it was last forgotten (no bound: nothing is evicted)."""
    idx = ApproxPrefixIndex(1 << 20)
    if defer:
        idx.defer_forgetting()
    sent: dict[str, list[tuple[int, ...]]] = {A: [], B: [], C: []}

    def held(worker: str, prompt: tuple[int, ...]) -> int:
        best = 0
        for p in sent[worker]:
            n = 0
            while n < min(len(p), len(prompt)) and p[n] == prompt[n]:
                n += 1
            best = max(best, n)
        return best

    for op, arg, prompt in ops:
        if op == "record":
            idx.record(arg, prompt)
            sent[arg].append(prompt)
        elif op == "forget":
            idx.forget(arg)
            sent[arg] = []
        elif op == "tidy":
            idx.tidy(arg)
        else:  # ask about every worker, or only those sent something (the live ones)
            workers = [A, B, C] if arg else [w for w in (A, B, C) if sent[w]]
            expected = [held(w, prompt) for w in workers]
            assert idx.match_all(workers, prompt) == expected
            assert [idx.match(w, prompt) for w in workers] == expected
            assert idx.matched(workers, prompt) == {
                w: d for w, d in zip(workers, expected, strict=True) if d
            }
    for w in (A, B, C):
        idx.forget(w)
    idx.tidy()
    assert not idx.pending and idx._root.children == {}


def _check_structure(idx: ApproxPrefixIndex) -> None:
    """Every listed worker is listed on all ancestors; each worker's order holds exactly the
    nodes listing it, descendants before ancestors; no node is left empty and childless."""
    orders = {**idx._lru, **idx._retired}
    assert len(orders) == len(idx._lru) + len(idx._retired)  # no id both live and retired
    listed: dict[int, set[int]] = {w: set() for w in orders}
    stack = list(idx._root.children.values())
    while stack:
        node = stack.pop()
        assert node.tenants or node.children
        for t in node.tenants:
            listed[t].add(id(node))
            parent = node.parent
            assert parent is idx._root or (parent is not None and t in parent.tenants)
        stack.extend(node.children.values())
    for w, order in orders.items():
        assert {id(n) for n in order} == listed[w]
        position = {id(n): i for i, n in enumerate(order)}
        for n in order:
            up = n.parent
            while up is not None and up is not idx._root:
                assert position[id(up)] > position[id(n)]
                up = up.parent


@pytest.mark.parametrize("bound", [4, 1 << 20])
@settings(max_examples=300, deadline=None)
@given(ops=_OPS)
def test_the_tree_stays_well_formed(
    bound: int, ops: list[tuple[Any, Any, tuple[int, ...]]]
) -> None:
    idx = ApproxPrefixIndex(bound)
    idx.defer_forgetting()
    for op, arg, prompt in ops:
        if op == "record":
            idx.record(arg, prompt)
        elif op == "forget":
            idx.forget(arg)
        elif op == "tidy":
            idx.tidy(arg)
        else:
            idx.match_all([A, B, C] if arg else [A], prompt)
        _check_structure(idx)
        assert all(idx.size(w) <= bound for w in (A, B, C))


@pytest.mark.parametrize("policy", ["sticky_until_saturated", "cache_aware_v2", "kv_cost"])
def test_a_removed_workers_index_entries_leave_in_the_chunks_of_the_routers_sweep(
    policy: str,
) -> None:
    clock = ManualClock()
    built = choose_policy(policy, {}).build(clock=clock, rng=random.Random(0))
    built.bound_sweeps(SWEEP_CHUNK)  # as serve does
    core = RoutingCore(built, Cluster([A]), rng=random.Random(0))
    for i in range(20):
        req = RouteRequest(session_id=f"s{i}", prompt_tokens=64, blocks=[i, 100 + i, 200 + i])
        core.complete(core.route(req))
    core.add_worker(B)
    core.remove_worker(A)  # O(1): the index keeps A's entries for the sweep
    assert built.sweep_pending()
    chunks = list(core.sweep_chunks(clock.now(), 7))
    assert len(chunks) > 1 and not built.sweep_pending()  # several bounded chunks, then done
    index = getattr(built, "approx" if policy == "kv_cost" else "index")
    assert isinstance(index, ApproxPrefixIndex) and index._root.children == {}
    again = RouteRequest(session_id="s0", prompt_tokens=64, blocks=[0, 100, 200])
    assert core.route(again).worker == B
