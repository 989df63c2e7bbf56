"""The local side of the shared session table: SharedSessionTable and SharedCluster."""

from __future__ import annotations

import random

from sessionroute.clock import ManualClock
from sessionroute.router import RoutingCore
from sessionroute.router.commit import MAX_COMMIT_ATTEMPTS, PinCommit
from sessionroute.router.policies.sticky_least_loaded import (
    StickyLeastLoadedConfig,
    StickyLeastLoadedPolicy,
)
from sessionroute.router.state.shared import SharedCluster, SharedSessionTable, share_table
from sessionroute.types import DecisionKind, RouteRequest

W = ("http://a", "http://b", "http://c")


def _policy() -> tuple[StickyLeastLoadedPolicy, SharedSessionTable]:
    pol = StickyLeastLoadedPolicy(clock=ManualClock(), rng=random.Random(0))
    table = share_table(pol)
    assert table is not None
    return pol, table


def test_share_table_keeps_ttl_and_capacity_and_skips_policies_without_sessions() -> None:
    pol = StickyLeastLoadedPolicy(
        StickyLeastLoadedConfig(session_ttl_s=30.0, max_sessions=5),
        clock=ManualClock(),
        rng=random.Random(0),
    )
    table = share_table(pol)
    assert table is pol.table and table.ttl_s == 30.0 and table._max == 5

    class NoTable:
        pass

    assert share_table(NoTable()) is None


def test_policy_places_by_the_shared_counts_not_its_own_pins() -> None:
    pol, table = _policy()
    cluster = SharedCluster(W)
    # other routers hold 5 sessions on a and b, none on c: a new session goes to c
    table.load("s1", None, {"http://a": 5, "http://b": 5}, 7, 0.0)
    d = pol.select(RouteRequest(session_id="s1"), cluster)
    assert d.worker == "http://c" and d.kind is DecisionKind.NEW
    assert table.count("http://c") == 1 and len(table) == 11
    assert table.decided_at("s1") == 7 and table.decided_at("s1") == -1


def test_a_pin_from_the_shared_table_makes_the_turn_sticky() -> None:
    pol, table = _policy()
    cluster = SharedCluster(W)
    table.load("s1", "http://b", {"http://b": 1}, 3, 0.0)
    d = pol.select(RouteRequest(session_id="s1"), cluster)
    assert (d.worker, d.kind) == ("http://b", DecisionKind.STICKY)
    # released elsewhere: the shared table has no pin any more, the cached one goes
    table.load("s1", None, {}, 4, 1.0)
    assert table.worker_of("s1") is None and len(table) == 0


def test_withdraw_undoes_a_refused_pin_and_its_counter() -> None:
    pol, table = _policy()
    cluster = SharedCluster(W)
    core = RoutingCore(pol, cluster)
    table.load("s1", None, {}, 0, 0.0)
    res = core.route(RouteRequest(session_id="s1", prompt_tokens=10))
    assert cluster.in_flight(res.worker) == 1 and table.stats.new == 1
    core.retract(res)
    table.withdraw("s1", new=True)
    assert cluster.in_flight(res.worker) == 0
    assert table.stats.new == 0 and table.worker_of("s1") is None
    assert core.decisions[DecisionKind.NEW] == 0


def test_cluster_adds_other_routers_in_flight_and_forgets_them_when_unknown() -> None:
    cluster = SharedCluster(W)
    cluster.reserve("http://a", 100)
    cluster.set_remote({"http://a": 3, "http://b": 2}, {"http://a": 300})
    assert cluster.in_flight("http://a") == 4 and cluster.in_flight_tokens("http://a") == 400
    assert cluster.local_load()[0] == ("http://a", 1, 100)
    cluster.set_remote(None)
    assert cluster.in_flight("http://b") == 0 and cluster.in_flight("http://a") == 1


def test_the_local_cache_is_bounded_without_counting_evictions() -> None:
    pol = StickyLeastLoadedPolicy(
        StickyLeastLoadedConfig(max_sessions=2), clock=ManualClock(), rng=random.Random(0)
    )
    table = share_table(pol)
    assert table is not None
    for k in range(5):
        table.load(f"s{k}", "http://a", {"http://a": k + 1}, k, float(k))
    assert [sid for sid, _ in table.pins()] == ["s3", "s4"]
    assert table.stats.evicted == 0 and table.count("http://a") == 5


def test_a_refused_pin_is_decided_again_on_the_state_the_refusal_returned() -> None:
    """PinCommit (the compare-and-set protocol of one placement, sans-I/O): a refusal that
    says another router pinned the session meanwhile sends it there, uncounting the first
    decision; a refusal that leaves it unpinned decides (and commits) again."""
    pol, table = _policy()
    cluster = SharedCluster(W)
    core = RoutingCore(pol, cluster)
    table.load("s1", None, {}, 7, 0.0)
    first = core.route(RouteRequest(session_id="s1", prompt_tokens=10))
    assert PinCommit.needed(table, first) and not PinCommit.needed(None, first)
    commit = PinCommit(core, table, first)
    assert commit.expected_version() == 7  # the version the decision was made on
    # moved on, still unpinned: decided again on the new counts, to be committed again
    busy = {first.worker: 5}
    assert commit.refused(None, busy, 8, 1.0)
    second = commit.reservation
    assert second is not first and first.done and second.worker != first.worker
    assert commit.expected_version() == 8 and commit.attempt == 1
    # pinned elsewhere meanwhile: the session goes there, nothing more to commit
    other = next(w for w in W if w not in (first.worker, second.worker))
    assert not commit.refused(other, {other: 1}, 9, 2.0)
    final = commit.reservation
    assert (final.worker, final.kind) == (other, DecisionKind.STICKY)
    assert core.decisions[DecisionKind.NEW] == 0 and table.stats.new == 0
    assert cluster.in_flight(other) == 1 and sum(cluster.in_flight(w) for w in W) == 1
    sticky = core.route(RouteRequest(session_id="s1"))
    assert not PinCommit.needed(table, sticky)  # a sticky turn writes no pin


def test_the_last_commit_attempt_pins_without_the_version_check() -> None:
    pol, table = _policy()
    core = RoutingCore(pol, SharedCluster(W))
    table.load("s1", None, {}, 0, 0.0)
    commit = PinCommit(core, table, core.route(RouteRequest(session_id="s1")))
    versions = []
    for i in range(MAX_COMMIT_ATTEMPTS):
        versions.append(commit.expected_version())
        assert commit.refused(None, {}, i + 1, float(i))
    assert versions[:-1] == list(range(MAX_COMMIT_ATTEMPTS - 1))
    assert versions[-1] is None


def test_offline_routers_place_an_unseen_session_alike_whatever_their_counts() -> None:
    (pa, ta), (pb, tb) = _policy(), _policy()
    ta.load(None, None, {"http://a": 9}, 3, 0.0)  # each router last saw other counts
    tb.load(None, None, {"http://b": 9, "http://c": 4}, 5, 0.0)
    online = [p.select(RouteRequest(session_id="s"), SharedCluster(W)).worker for p in (pa, pb)]
    assert online[0] != online[1]  # by load, each its own way
    ta.offline = tb.offline = True
    for k in range(20):
        sid = f"new{k}"
        da = pa.select(RouteRequest(session_id=sid), SharedCluster(W))
        db = pb.select(RouteRequest(session_id=sid), SharedCluster(W))
        assert da.worker == db.worker and da.kind is db.kind is DecisionKind.NEW
    # a session either router knows stays where it is
    assert pa.select(RouteRequest(session_id="s"), SharedCluster(W)).worker == online[0]
