"""``adaptive_hold``'s short-session placer (rule 7, ``short_place = "cache_aware_v2"``) over
random sequences: whatever the turns, completions, releases, thrash, waits, chunked sweeps and
workers removed and added again, once every request has completed the placer keeps no
request in flight (its in-flight prefill map empties), no working set is kept for a worker
that left, and after a sweep its prefix index holds nothing of one; with rule 8 on too (first
turns diverted to a sacrifice), and no sacrifice is a worker that left."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionroute.clock import ManualClock
from sessionroute.router import RouterConfig, RoutingCore
from sessionroute.router.admission import Ticket
from sessionroute.router.core import Reservation
from sessionroute.router.policies.adaptive_hold import AdaptiveHoldConfig, AdaptiveHoldPolicy
from sessionroute.router.state import Cluster
from sessionroute.types import EngineGauges, RouteRequest

WORKERS = ("http://a:8000", "http://b:8000", "http://c:8000")
THRASH = EngineGauges(running=1, waiting=8, kv_usage=0.96)
CALM = EngineGauges(running=1, waiting=0, kv_usage=0.3)

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["turn"] * 5
            + ["done"] * 4
            + ["finish"] * 2
            + ["calm", "thrash", "wait", "remove", "add", "sweep"]
        ),
        st.integers(0, 9),  # session (or worker: i % 3)
        st.integers(1, 900),  # prompt size, or tenths of a second
    ),
    min_size=10,
    max_size=120,
)


def _settle(core: RoutingCore, tickets: list[Ticket]) -> None:
    """Complete every placed ticket's request until none is left to place (a completion may
    place a waiting one)."""
    completed: set[int] = set()
    while fresh := [t for t in tickets if t.reservation is not None and id(t) not in completed]:
        for t in fresh:
            completed.add(id(t))
            assert t.reservation is not None
            core.complete(t.reservation)
        core.recheck()


@settings(max_examples=200, deadline=None)
@given(OPS, st.booleans(), st.sampled_from([0.0, 0.5]), st.booleans())
def test_the_placer_keeps_nothing_in_flight_once_every_request_completed(
    ops: list[tuple[str, int, int]], pack: bool, floor: float, overload: bool
) -> None:
    clock = ManualClock()
    cfg = AdaptiveHoldConfig(
        capacity_min_kv=0.2, hold_interval_s=1.0, hold_check_s=0.5, short_turns=3.0,
        short_place="cache_aware_v2", ceiling_floor=floor, pack_past_knee=pack,
        wait_bound=True, max_wait_s=30.0, overload_window_s=1.0 if overload else 0.0,
        overload_waiting=1.0,
    )  # fmt: skip
    p = AdaptiveHoldPolicy(cfg, clock=clock, rng=random.Random(0))
    core = RoutingCore(p, Cluster(list(WORKERS)), RouterConfig())
    open_: dict[int, Reservation] = {}
    tickets: list[Ticket] = []
    turns: dict[int, int] = {}
    removed: list[str] = []
    for op, i, n in ops:
        sid, worker = f"s{i}", WORKERS[i % 3]
        busy = i in open_ or any(t.request.session_id == sid and t.waiting for t in tickets)
        if op == "turn" and not busy:
            turns[i] = turns.get(i, 0) + 1
            blocks = tuple(range(i % 3, i % 3 + 4 + turns[i]))  # sessions share prefixes
            request = RouteRequest(
                session_id=sid, prompt_tokens=10 * n + 16, request_id=f"{sid}.{turns[i]}",
                blocks=blocks,
            )  # fmt: skip
            placed = core.place(request, lambda t: None)
            if isinstance(placed, Reservation):
                open_[i] = placed
            else:
                tickets.append(placed)
        elif op == "done" and i in open_:
            core.complete(open_.pop(i))
        elif op == "finish":
            core.finish_session(sid)
        elif op in ("thrash", "calm") and worker in core.cluster.workers():
            core.cluster.set_gauges(worker, THRASH if op == "thrash" else CALM)
        elif op == "wait":
            clock.advance(n / 10.0)
            core.recheck()
        elif op == "remove" and worker in core.cluster.workers() and len(removed) < 2:
            core.remove_worker(worker)
            removed.append(worker)
        elif op == "add" and removed:
            core.add_worker(removed.pop())
        elif op == "sweep":
            for _ in core.sweep_chunks(clock.now(), 2):
                pass
    for r in open_.values():
        core.complete(r)
    clock.advance(10_000.0)  # every hold and wait is past its bound
    core.recheck()
    _settle(core, tickets)
    placer = p._short.placer
    assert placer is not None
    prefill = placer._policy.prefill
    assert prefill._by_request == {} and not any(prefill.totals.values())
    live = set(core.cluster.workers())
    assert set(p.context_tokens()) <= live
    if p._overload is not None:  # rule 8 (its diversions recorded where the turns went)
        assert set(p._overload.sacrifices) <= live
    core.sweep(clock.now())  # a whole sweep drops what removed workers left in the index
    index = placer._policy.index
    assert set(index._ids) <= live and not index.pending and not p.sweep_pending()
