"""Property tests: replay determinism, balanced first turns, consistent-hash key movement, and
the exactness of the fast and batched fbi_hash against the literal algorithm of ROUTER.md."""

from __future__ import annotations

import random
import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionroute.clock import ManualClock
from sessionroute.errors import NoWorkerAvailable
from sessionroute.router.core import RoutingCore
from sessionroute.router.policies import create_policy, policy_names
from sessionroute.router.policies._rendezvous import BATCH_MIN, fbi_hash_many, rendezvous_winner
from sessionroute.router.policies.hashing import fbi_hash, rendezvous_score
from sessionroute.router.policies.registry import policy_class, takes_option
from sessionroute.router.state import Cluster
from sessionroute.types import RouteRequest

URLS = [f"http://10.1.0.{i}:8000" for i in range(6)]
SIDS = st.sampled_from([None, "a", "b", "c", "d", "e"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("route"), SIDS, st.text(alphabet="xy", max_size=6)),
        st.tuples(st.just("complete"), st.integers(0, 99)),
        st.tuples(st.just("release"), SIDS),
        st.tuples(st.just("health"), st.integers(0, 5), st.booleans()),
        st.tuples(st.just("toggle_member"), st.integers(0, 5)),
        st.tuples(st.just("advance"), st.sampled_from([1.0, 50.0, 5000.0])),
        st.tuples(st.just("sweep")),
    ),
    max_size=40,
)


def _replay(name: str, ops: list[tuple[Any, ...]], seed: int) -> list[tuple[str | None, str, str]]:
    clock = ManualClock()
    core = RoutingCore(
        create_policy(
            name,
            {"session_ttl_s": 100.0} if takes_option(policy_class(name), "session_ttl_s") else None,
            clock=clock,
            rng=random.Random(seed),
        ),
        Cluster(URLS[:3]),
    )
    core.log = []
    held = []
    for op in ops:
        kind = op[0]
        if kind == "route":
            try:
                held.append(
                    core.route(RouteRequest(session_id=op[1], blocks=[ord(c) for c in op[2]]))
                )
            except NoWorkerAvailable:
                core.log.append((op[1], "-", "none"))
        elif kind == "complete" and held:
            core.complete(held.pop(op[1] % len(held)))
        elif kind == "release" and op[1] is not None:
            core.finish_session(op[1])
        elif kind == "health" and URLS[op[1]] in core.cluster:
            core.set_health(URLS[op[1]], op[2])
        elif kind == "toggle_member":
            url = URLS[op[1]]
            if url in core.cluster:
                core.remove_worker(url)
            else:
                core.add_worker(url)
        elif kind == "advance":
            clock.advance(op[1])
        elif kind == "sweep":
            core.sweep(clock.now())
    return core.log


@settings(max_examples=30, deadline=None)
@given(ops=OPS, seed=st.integers(0, 2**32 - 1))
def test_same_seed_replays_the_same_decisions(ops: list[tuple[Any, ...]], seed: int) -> None:
    for name in policy_names():
        first = _replay(name, ops, seed)
        assert first == _replay(name, ops, seed), name
        assert len(first) == sum(op[0] == "route" for op in ops)


@settings(max_examples=40, deadline=None)
@given(sids=st.lists(st.text(min_size=1, max_size=20), min_size=12, max_size=12, unique=True))
def test_twelve_new_sessions_on_four_idle_workers_split_evenly(sids: list[str]) -> None:
    urls = URLS[:4]
    core = RoutingCore(create_policy("sticky_least_loaded", clock=ManualClock()), Cluster(urls))
    got = [core.route(RouteRequest(session_id=s)).worker for s in sids]
    assert sorted(got.count(u) for u in urls) == [3, 3, 3, 3]
    assert core.policy.session_counts() == dict.fromkeys(urls, 3)


def _ch_placement(urls: list[str], sids: list[str]) -> dict[str, str]:
    core = RoutingCore(create_policy("consistent_hash", clock=ManualClock()), Cluster(urls))
    return {s: core.route(RouteRequest(session_id=s)).worker for s in sids}


@settings(max_examples=30, deadline=None)
@given(
    sids=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=40, unique=True),
    n=st.integers(1, 5),
)
def test_consistent_hash_moves_only_the_keys_of_the_changed_worker(sids: list[str], n: int) -> None:
    base = URLS[:n]
    newcomer = URLS[5]
    before = _ch_placement(base, sids)
    after_add = _ch_placement([*base, newcomer], sids)
    for s in sids:
        assert after_add[s] in (before[s], newcomer)  # only keys now hashing to it move
    if n > 1:
        gone = base[0]
        after_remove = _ch_placement(base[1:], sids)
        for s in sids:
            if before[s] != gone:
                assert after_remove[s] == before[s]  # only the removed worker's keys move
            else:
                assert after_remove[s] != gone


def test_consistent_hash_follows_live_membership_changes() -> None:
    core = RoutingCore(create_policy("consistent_hash", clock=ManualClock()), Cluster(URLS[:3]))
    sids = [f"k{i}" for i in range(60)]
    before = {s: core.route(RouteRequest(session_id=s)).worker for s in sids}
    core.add_worker(URLS[3])
    added = {s: core.route(RouteRequest(session_id=s)).worker for s in sids}
    moved = {s for s in sids if added[s] != before[s]}
    assert moved and all(added[s] == URLS[3] for s in moved)
    core.remove_worker(URLS[3])
    assert {s: core.route(RouteRequest(session_id=s)).worker for s in sids} == before


# -- hashing exactness ---------------------------------------------------------------------------

_M = 0xC6A4A7935BD1E995
_MASK = (1 << 64) - 1
_SEED = 4193360111


def _ref_murmur(data: bytes) -> int:
    """MurmurHash64A written out from the ROUTER.md description (reference only)."""
    h = (_SEED ^ (len(data) * _M)) & _MASK
    full = len(data) // 8 * 8
    for (k,) in struct.iter_unpack("<Q", data[:full]):
        k = (k * _M) & _MASK
        k ^= k >> 47
        k = (k * _M) & _MASK
        h = ((h ^ k) * _M) & _MASK
    tail = data[full:]
    if tail:
        h = ((h ^ int.from_bytes(tail, "little")) * _M) & _MASK
    h ^= h >> 47
    h = (h * _M) & _MASK
    return h ^ (h >> 47)


def _ref_fbi(data: bytes) -> int:
    blocks = [_ref_murmur(data)]

    def bit(i: int) -> int:
        while i // 64 >= len(blocks):
            blocks.append(_ref_murmur(struct.pack("<Q", blocks[-1])))
        return (blocks[i // 64] >> (i % 64)) & 1

    m = 2**23 - 1
    d = 23
    a = d
    result = 0
    for _ in range(32):
        while not bit(a):
            if d == 0:
                return _ref_murmur(struct.pack("<I", 0))
            d -= 1
            a = d
        a += 23
        num = 1
        for _ in range(d - 1):
            num = 2 * num + bit(a)
            a += 23
        if num < m:
            result = num
            break
    return _ref_murmur(struct.pack("<I", result))


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.binary(max_size=48), min_size=1, max_size=40))
def test_fast_and_batched_fbi_hash_equal_the_reference(keys: list[bytes]) -> None:
    expected = [_ref_fbi(k) for k in keys]
    assert [fbi_hash(k) for k in keys] == expected
    assert fbi_hash_many(keys) == expected


def test_rendezvous_winner_matches_scalar_max_and_first_wins_ties() -> None:
    urls = [f"http://192.168.7.{i}:8000" for i in range(64)]
    for s in range(40):
        sid = f"sess-{s}"
        for n in (1, 2, BATCH_MIN - 1, BATCH_MIN, 64):
            cand = urls[:n]
            expected = max(cand, key=lambda w: rendezvous_score(sid, w))  # first max wins
            assert rendezvous_winner(sid, cand) == expected
    dup = ["http://same"] * BATCH_MIN
    assert rendezvous_winner("x", dup) == "http://same"
    assert fbi_hash_many([]) == []


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("route"), st.sampled_from(["a", "b", "c", "d", "e", "f"])),
            st.tuples(st.just("health"), st.integers(0, 5), st.booleans()),
            st.tuples(st.just("add"), st.integers(0, 5)),
            st.tuples(st.just("remove"), st.integers(0, 5)),
        ),
        max_size=60,
    )
)
def test_consistent_hash_memo_places_as_the_ring_does(ops: list[tuple[Any, ...]]) -> None:
    """The per-session memo of ``consistent_hash`` gives the ring's owner of the session's
    key on the current healthy set, through workers added, removed, marked unhealthy and
    coming back (a fresh policy, with nothing remembered, is the reference)."""
    core = RoutingCore(create_policy("consistent_hash", clock=ManualClock()), Cluster(URLS[:3]))
    for op in ops:
        url = URLS[op[1]] if op[0] != "route" else ""
        if op[0] == "route":
            try:
                got = core.route(RouteRequest(session_id=op[1])).worker
            except NoWorkerAvailable:
                assert not core.cluster.healthy()
                continue
            fresh = create_policy("consistent_hash", clock=ManualClock())
            assert got == fresh.select(RouteRequest(session_id=op[1]), core.cluster).worker
        elif op[0] == "health" and url in core.cluster.workers():
            core.set_health(url, op[2])
        elif op[0] == "add" and url not in core.cluster.workers():
            core.add_worker(url)
        elif op[0] == "remove" and url in core.cluster.workers():
            core.remove_worker(url)


def test_consistent_hash_memo_is_bounded() -> None:
    from sessionroute.router.policies.consistent_hash import PLACED_CAPACITY

    policy = create_policy("consistent_hash", clock=ManualClock())
    cluster = Cluster(URLS[:3])
    first = policy.select(RouteRequest(session_id="s0"), cluster).worker
    for i in range(PLACED_CAPACITY + 10):
        policy.select(RouteRequest(session_id=f"s{i}"), cluster)
    assert len(policy._placed) == PLACED_CAPACITY  # type: ignore[attr-defined]
    assert ("x-session-id", "s0") not in policy._placed  # type: ignore[attr-defined]
    assert policy.select(RouteRequest(session_id="s0"), cluster).worker == first
