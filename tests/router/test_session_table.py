"""The session table's chunked sweep and session lookup (issue 19, items 6 and 7)."""

from __future__ import annotations

import random

from sessionroute.router.config import RouterConfig
from sessionroute.router.retry import AttemptFailure, RetryPolicy, WorkerLostAction
from sessionroute.router.state.sessions import SessionTable


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


def test_only_attempts_that_provably_did_not_run_are_retried() -> None:
    strict = RetryPolicy(RouterConfig(), random.Random(0))
    assert [strict.may_retry(f) for f in AttemptFailure] == [True, True, True, False]
    loose = RetryPolicy(RouterConfig(retry_after_send=True), random.Random(0))
    assert all(loose.may_retry(f) for f in AttemptFailure)
    assert strict.on_worker_lost(client_started=False) is WorkerLostAction.REPLACE
    assert strict.on_worker_lost(client_started=True) is WorkerLostAction.WATCH
