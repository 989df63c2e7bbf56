"""The session table's chunked sweep, lazy displacement, byte cap and session lookup (issue 19,
items 3, 6 and 7)."""

from __future__ import annotations

import random

from sessionroute.clock import ManualClock
from sessionroute.router import RoutingCore, choose_policy
from sessionroute.router.config import RouterConfig
from sessionroute.router.policies._ring import KeyHashCache
from sessionroute.router.retry import AttemptFailure, RetryPolicy, WorkerLostAction
from sessionroute.router.state import Cluster
from sessionroute.router.state.sessions import ENTRY_OVERHEAD_BYTES, SessionTable, entry_bytes
from sessionroute.types import RouteRequest


def test_a_limited_sweep_expires_the_oldest_first_and_leaves_the_rest() -> None:
    table = SessionTable(ttl_s=10.0)
    for i in range(10):
        table.pin(f"s{i}", "w", float(i))
    table.pin("fresh", "w", 100.0)
    got = [table.sweep(120.0, 3) for _ in range(5)]  # cutoff 110: all 11 expire, 3 a call
    assert got == [3, 3, 3, 2, 0] and len(table) == 0
    assert table.stats.expired == 11
    table.pin("a", "w", 0.0)
    table.pin("b", "w", 50.0)
    assert table.sweep(55.0, 1) == 1 and "a" not in table and "b" in table


def test_session_info_counts_turns_on_its_worker() -> None:
    table = SessionTable(ttl_s=100.0)
    assert table.info("x") is None
    table.pin("x", "w1", 5.0)
    table.touch("x", 7.0)
    table.touch("x", 9.0)
    info = table.info("x")
    assert info is not None
    assert (info.worker, info.pinned_at, info.last_seen, info.turns) == ("w1", 5.0, 9.0, 3)
    table.pin("x", "w2", 20.0)  # re-pinned: counted afresh on the new worker
    info = table.info("x")
    assert info is not None and (info.worker, info.turns, info.pinned_at) == ("w2", 1, 20.0)


def test_without_retry_after_send_only_attempts_that_provably_did_not_run_are_retried() -> None:
    strict = RetryPolicy(RouterConfig(retry_after_send=False), random.Random(0))
    assert [strict.may_retry(f) for f in AttemptFailure] == [True, True, True, False, False]
    loose = RetryPolicy(RouterConfig(), random.Random(0))  # vllm-router's way, the default
    assert [loose.may_retry(f) for f in AttemptFailure] == [True, True, True, True, False]
    assert strict.on_worker_lost(client_started=False) is WorkerLostAction.REPLACE
    assert strict.on_worker_lost(client_started=True) is WorkerLostAction.WATCH


def test_removing_a_worker_leaves_its_pins_stale_until_each_session_returns() -> None:
    table = SessionTable(ttl_s=100.0)
    for i in range(5):
        table.pin(f"a{i}", "wa", float(i))
    table.pin("b0", "wb", 5.0)
    assert table.displace("wa") == 5
    # gone from every view at once, though the entries are dropped lazily
    assert len(table) == 1 and table.counts() == {"wb": 1} and table.count("wa") == 0
    assert "a0" not in table and table.worker_of("a0") is None and table.info("a0") is None
    assert table.lookup("a0", 10.0) is None and table.sessions_on("wa") == []
    assert table.take_displaced("a0", 10.0) is True  # its next turn: a re-pin, once
    assert table.take_displaced("a0", 10.0) is False
    # the same url added back: new pins are live, the old ones stay stale
    table.pin("a0", "wa", 11.0)
    assert table.count("wa") == 1 and table.worker_of("a1") is None and len(table) == 2
    assert table.release("a1") is False and table.stats.released == 0
    assert table.take_displaced("a2", 200.0) is False  # idle past the TTL: expired, not moved
    assert table.stats.expired == 1
    assert table.sweep(104.5) == 2  # a3, a4: stale and past the TTL, counted as expired
    assert table.stats.expired == 3 and len(table) == 2 and table.counts() == {"wa": 1, "wb": 1}


def test_a_removed_workers_stale_pins_are_evicted_first_when_oldest() -> None:
    table = SessionTable(ttl_s=100.0, max_sessions=3)
    table.pin("a", "w1", 0.0)
    table.pin("b", "w2", 1.0)
    table.displace("w1")
    table.pin("c", "w2", 2.0)
    table.pin("d", "w2", 3.0)  # the entry cap counts the stale "a": it goes first
    assert table.stats.evicted == 1 and table.take_displaced("a", 4.0) is False
    assert len(table) == 3 and table.counts() == {"w2": 3}


def test_the_byte_cap_evicts_the_least_recently_used_like_the_entry_cap() -> None:
    per = entry_bytes("s0")
    table = SessionTable(ttl_s=100.0, max_bytes=3 * per)
    for i in range(3):
        table.pin(f"s{i}", "w", float(i))
    assert table.nbytes == 3 * per and table.stats.evicted == 0
    table.touch("s0", 5.0)  # s1 is now the least recently used
    table.pin("s3", "w", 6.0)
    assert table.stats.evicted == 1 and "s1" not in table and "s0" in table
    assert table.nbytes == 3 * per
    long_id = "x" * (2 * per)  # one long id takes the room of several short ones
    table.pin(long_id, "w", 7.0)
    assert table.nbytes <= 3 * per and len(table) == 1 and long_id in table
    assert table.stats.evicted == 4
    table.release(long_id)
    assert table.nbytes == 0


def test_entry_bytes_counts_the_id_and_a_fixed_overhead() -> None:
    assert entry_bytes("") == ENTRY_OVERHEAD_BYTES
    assert entry_bytes("a" * 100) == ENTRY_OVERHEAD_BYTES + 100
    assert entry_bytes("é" * 10) == ENTRY_OVERHEAD_BYTES + 40  # the most CPython stores


def test_the_core_sweeps_in_chunks_and_whole() -> None:
    clock = ManualClock()
    policy = choose_policy("sticky_least_loaded", {}, session_ttl_s=10.0).build(
        clock=clock, rng=random.Random(0)
    )
    core = RoutingCore(policy, Cluster(["http://a", "http://b"]))
    for i in range(25):
        core.complete(core.route(RouteRequest(session_id=f"s{i}", prompt_tokens=1)))
    clock.advance(20.0)
    assert list(core.sweep_chunks(clock.now(), 10)) == [10, 10, 5]
    for i in range(7):
        core.complete(core.route(RouteRequest(session_id=f"t{i}", prompt_tokens=1)))
    clock.advance(20.0)
    assert list(core.sweep_chunks(clock.now(), 7)) == [7, 0]
    assert core.sweep(clock.now()) == 0 and policy.session_stats().expired == 32


def test_a_full_key_hash_cache_evicts_its_oldest_entry_per_new_key() -> None:
    cache = KeyHashCache(capacity=3)
    hashes = [cache(k) for k in ("a", "b", "c", "d")]
    assert len(cache) == 3 and hashes[0] == cache("a")  # "a" was evicted and computed again
    assert len(cache) == 3


def test_bounded_sweeps_inside_select_expire_a_chunk_per_routing_call() -> None:
    clock = ManualClock()
    policy = choose_policy("sticky_least_loaded", {}, session_ttl_s=10.0).build(
        clock=clock, rng=random.Random(0)
    )
    core = RoutingCore(policy, Cluster(["http://a", "http://b"]), sweep_chunk=4)
    for i in range(10):
        core.complete(core.route(RouteRequest(session_id=f"s{i}", prompt_tokens=1)))
    clock.advance(100.0)  # past the TTL and the policy's sweep interval (60 s)
    expired = []
    for i in range(4):
        core.complete(core.route(RouteRequest(session_id=f"n{i}", prompt_tokens=1)))
        expired.append(policy.session_stats().expired)
    assert expired == [4, 8, 10, 10]  # 4 a call until none are left, then none


def test_the_byte_cap_reaches_the_policies_from_the_router_config_and_serve_flags() -> None:
    from sessionroute.serve.config import RouterSettings

    settings = RouterSettings.build(session_table_max_bytes=12345)
    config = settings.router_config()
    assert config.session_table_max_bytes == 12345
    assert RouterConfig().session_table_max_bytes == 256 * 1024 * 1024
    for name in ("sticky_least_loaded", "consistent_hash_bounded_load", "adaptive_sticky"):
        choice = choose_policy(name, {}, session_table_max_bytes=config.session_table_max_bytes)
        policy = choice.build(clock=ManualClock(), rng=random.Random(0))
        assert policy.table.max_bytes == 12345  # type: ignore[attr-defined]
    own = choose_policy(
        "sticky_least_loaded", {"session_table_max_bytes": 99}, session_table_max_bytes=5
    )
    assert own.build(clock=ManualClock(), rng=random.Random(0)).table.max_bytes == 99  # type: ignore[attr-defined]


def test_on_drop_hears_what_the_table_drops_by_itself_and_nothing_its_caller_asks() -> None:
    table = SessionTable(ttl_s=10.0, max_sessions=3)
    dropped: list[str] = []
    table.on_drop = dropped.append
    table.pin("a", "w", 0.0)
    table.pin("b", "w", 1.0)
    table.pin("c", "w", 2.0)
    table.pin("a", "w2", 3.0)  # a pin over an old pin: asked for
    table.unpin("b")
    table.release("c")
    assert dropped == []
    table.pin("d", "w", 4.0)
    table.pin("e", "w", 5.0)
    table.pin("f", "w", 6.0)  # over the entry cap: the least recently used ("a") is evicted
    assert dropped == ["a"] and table.stats.evicted == 1
    assert table.lookup("d", 14.5) is None  # expired on its revisit
    assert dropped == ["a", "d"]
    table.displace("w")
    assert table.take_displaced("e", 15.5) is False  # expired, but the caller took it
    assert table.sweep(16.5) == 1 and dropped == ["a", "d", "f"]  # f: stale, past the TTL


def test_a_shared_tables_cache_says_what_it_drops() -> None:
    from sessionroute.router.state.shared import SharedSessionTable

    table = SharedSessionTable(ttl_s=100.0)
    dropped: list[str] = []
    table.on_drop = dropped.append
    table.load("s", "w1", {"w1": 1}, 1, 0.0)
    table.load("s", "w1", {"w1": 1}, 2, 1.0)  # the same pin: kept
    assert dropped == [] and table.worker_of("s") == "w1"
    table.load("s", "w2", {"w2": 1}, 3, 2.0)  # another router moved it
    assert dropped == ["s"] and table.worker_of("s") == "w2"
    table.load("s", None, {}, 4, 3.0)  # the shared table no longer has it
    assert dropped == ["s", "s"] and table.worker_of("s") is None
    table.load("s", None, {}, 5, 4.0)  # nothing cached: nothing to drop
    assert dropped == ["s", "s"]
