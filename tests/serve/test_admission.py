"""The router core's admission queue: held-back requests wait in order, bounded, and leave once."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any, ClassVar

import aiohttp
import pytest

from sessionroute.clock import Clock, ManualClock, MonotonicClock
from sessionroute.errors import AdmissionRefused, NoWorkerAvailable
from sessionroute.router import RouterConfig, RoutingCore
from sessionroute.router.admission import Ticket
from sessionroute.router.core import Reservation
from sessionroute.router.policies.base import Policy, least_loaded_of, require_healthy
from sessionroute.router.policies.sticky_least_loaded import (
    StickyLeastLoadedConfig,
    StickyLeastLoadedPolicy,
)
from sessionroute.router.state import Cluster, ClusterView
from sessionroute.serve.metrics import RouterMetrics
from sessionroute.sim import SimSpec, run_simulation
from sessionroute.types import Decision, DecisionKind, RouteRequest

from .backend import FakeBackend
from .conftest import MakeRouter, post_chat

W = ["http://w1", "http://w2"]


@dataclass(frozen=True, slots=True)
class GateConfig:
    """Options of :class:`InFlightGate`.

    Attributes:
        max_in_flight: requests in flight over all workers beyond which new ones wait.
    """

    max_in_flight: int = 2


class InFlightGate(Policy):
    """Least loaded, admitting a request only while fewer than ``max_in_flight`` are in flight."""

    name: ClassVar[str] = "in_flight_gate"
    Config: ClassVar[type[Any] | None] = GateConfig

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)

    def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
        total = sum(cluster.in_flight(w) for w in cluster.healthy())
        return bool(total < self.config.max_in_flight)

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        healthy = require_healthy(cluster)
        worker = least_loaded_of(healthy, cluster, request.request_id or "")
        return Decision(worker, DecisionKind.STATELESS)


def _core(max_waiting: int = 2, max_in_flight: int = 2) -> RoutingCore:
    policy = InFlightGate(GateConfig(max_in_flight), clock=ManualClock(), rng=random.Random(0))
    config = RouterConfig(admission_max_waiting=max_waiting)
    return RoutingCore(policy, Cluster(W), config, log=[])


def _req(i: int) -> RouteRequest:
    return RouteRequest(request_id=f"r{i}", prompt_tokens=10)


def test_held_back_requests_are_placed_in_arrival_order_as_capacity_frees() -> None:
    core = _core()
    ready: list[Ticket] = []
    a = core.place(_req(1), ready.append)
    b = core.place(_req(2), ready.append)
    c = core.place(_req(3), ready.append)
    d = core.place(_req(4), ready.append)
    assert isinstance(a, Reservation) and isinstance(b, Reservation)
    assert isinstance(c, Ticket) and isinstance(d, Ticket) and c.waiting and d.waiting
    assert core.log is not None and len(core.log) == 2  # nothing placed for the waiting ones
    core.complete(a)
    assert ready == [c] and not c.waiting and isinstance(c.reservation, Reservation)
    assert d.waiting  # still two in flight: b and c
    core.complete(b)
    assert ready == [c, d] and d.reservation is not None
    assert [rid for rid in (r.request.request_id for r in (c.reservation, d.reservation))] == [
        "r3",
        "r4",
    ]
    assert core.admission.admitted_after_wait == 2


def test_a_new_request_never_overtakes_a_waiting_one() -> None:
    core = _core(max_waiting=4)
    ready: list[Ticket] = []
    a = core.place(_req(1), ready.append)
    core.place(_req(2), ready.append)
    waiting = core.place(_req(3), ready.append)
    assert isinstance(a, Reservation) and isinstance(waiting, Ticket)
    core.complete(a)  # admits r3, the head
    assert ready == [waiting]
    late = core.place(_req(4), ready.append)
    assert isinstance(late, Ticket)  # two in flight again (r2, r3): r4 waits too


def test_a_full_queue_refuses_and_a_deadline_withdraws() -> None:
    core = _core(max_waiting=1)
    ready: list[Ticket] = []
    core.place(_req(1), ready.append)
    core.place(_req(2), ready.append)
    waiting = core.place(_req(3), ready.append)
    assert isinstance(waiting, Ticket)
    with pytest.raises(AdmissionRefused) as full:
        core.place(_req(4), ready.append)
    assert full.value.reason == "queue_full"
    refused = core.withdraw(waiting)
    assert refused is not None and refused.reason == "timeout"
    assert core.withdraw(waiting) is None  # once
    assert (core.admission.refused_full, core.admission.refused_timeout, len(core.admission)) == (
        1,
        1,
        0,
    )
    assert ready == []  # a withdrawn ticket is never woken


class PlacingGate(InFlightGate):
    """:class:`InFlightGate` whose held requests are placed at their maximum wait."""

    places_at_max_wait: ClassVar[bool] = True


def test_a_full_queue_places_its_oldest_for_a_policy_that_places_at_its_max_wait() -> None:
    """Such a policy's hold ends in a placement, never a refusal: with the queue full the
    longest-waiting request is placed now (counted) and the new one waits in its place."""
    policy = PlacingGate(GateConfig(2), clock=ManualClock(), rng=random.Random(0))
    core = RoutingCore(policy, Cluster(W), RouterConfig(admission_max_waiting=2), log=[])
    ready: list[Ticket] = []
    core.place(_req(1), ready.append)
    core.place(_req(2), ready.append)
    oldest = core.place(_req(3), ready.append)
    second = core.place(_req(4), ready.append)
    assert isinstance(oldest, Ticket) and isinstance(second, Ticket)
    newest = core.place(_req(5), ready.append)
    assert ready == [oldest] and oldest.reservation is not None
    assert isinstance(newest, Ticket) and second.waiting and newest.waiting
    q = core.admission
    assert (q.placed_when_full, q.refused_full, q.admitted_after_wait, len(q)) == (1, 0, 1, 2)
    assert core.withdraw(oldest) is None  # its deadline timer finds it gone
    closed = PlacingGate(GateConfig(0), clock=ManualClock(), rng=random.Random(0))
    none_wait = RoutingCore(closed, Cluster(W), RouterConfig(admission_max_waiting=0), log=[])
    assert isinstance(none_wait.place(_req(6), ready.append), Reservation)  # none may wait
    assert none_wait.admission.placed_when_full == 1


def test_placed_when_full_is_its_own_outcome_and_counts_only_placements() -> None:
    """``/metrics`` counts each placement under one outcome (``placed`` does not count the
    full queue's placements again), and a request that cannot be placed at once (no worker)
    is not counted as placed."""
    policy = PlacingGate(GateConfig(0), clock=ManualClock(), rng=random.Random(0))
    core = RoutingCore(policy, Cluster(W), RouterConfig(admission_max_waiting=1), log=[])
    ready: list[Ticket] = []
    core.place(_req(1), ready.append)
    core.place(_req(2), ready.append)  # r1 placed to make room
    text = RouterMetrics(core, dict).render().decode()
    assert 'sessionroute_admission_total{outcome="placed"} 0.0' in text
    assert 'sessionroute_admission_total{outcome="placed_when_full"} 1.0' in text
    closed = PlacingGate(GateConfig(0), clock=ManualClock(), rng=random.Random(0))
    none_wait = RoutingCore(closed, Cluster(W), RouterConfig(admission_max_waiting=0), log=[])
    for w in W:
        none_wait.cluster.set_healthy(w, False)
    with pytest.raises(NoWorkerAvailable):
        none_wait.place(_req(3), ready.append)
    assert none_wait.admission.placed_when_full == 0
    for w in W:
        none_wait.cluster.set_healthy(w, True)
    none_wait.place(_req(4), ready.append)
    text = RouterMetrics(none_wait, dict).render().decode()
    assert 'sessionroute_admission_total{outcome="placed"} 0.0' in text
    assert 'sessionroute_admission_total{outcome="placed_when_full"} 1.0' in text


def test_a_cancelled_ticket_releases_what_it_was_given() -> None:
    core = _core()
    ready: list[Ticket] = []
    a = core.place(_req(1), ready.append)
    core.place(_req(2), ready.append)
    t = core.place(_req(3), ready.append)
    assert isinstance(a, Reservation) and isinstance(t, Ticket)
    core.complete(a)  # t is placed just as its client goes away
    assert t.reservation is not None
    core.cancel_ticket(t)
    assert sum(core.cluster.in_flight(w) for w in W) == 1  # only r2 is left
    assert t.reservation.done


def test_with_no_worker_a_waiting_ticket_fails_instead_of_waiting_forever() -> None:
    core = _core()
    ready: list[Ticket] = []
    a = core.place(_req(1), ready.append)
    b = core.place(_req(2), ready.append)
    t = core.place(_req(3), ready.append)
    assert isinstance(a, Reservation) and isinstance(b, Reservation) and isinstance(t, Ticket)
    for w in W:
        core.set_health(w, False)
    core.complete(a)
    assert ready == [t] and isinstance(t.error, NoWorkerAvailable) and t.reservation is None


# -- the same queue driven by serve (real time) and by the simulator (virtual time) -----------


async def test_serve_queues_held_back_requests_and_answers_503_when_full_or_late(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router(
        [b.url for b in backends[:1]],
        policy=f"{__name__}:InFlightGate",
        admission_max_waiting=1,
        admission_max_wait_secs=30.0,
    )
    core = router.router.core
    core.policy.config = GateConfig(max_in_flight=1)
    hold = asyncio.Event()
    backends[0].hold = hold
    first = asyncio.create_task(post_chat(client, router, "a"))
    while len(backends[0].seen) < 1:
        await asyncio.sleep(0.002)
    second = asyncio.create_task(post_chat(client, router, "b"))
    while len(core.admission) < 1:  # the second waits at the router, not at the worker
        await asyncio.sleep(0.002)
    status, body = await post_chat(client, router, "c")  # the queue (1) is full
    assert status == 503 and body["error"]["code"] == "admission_queue_full"
    assert len(backends[0].seen) == 1
    hold.set()
    assert (await first)[0] == 200 and (await second)[0] == 200
    assert backends[0].sessions() == ["a", "b"]
    assert core.cluster.in_flight(backends[0].url) == 0
    async with client.get(router.url + "/metrics") as r:
        text = await r.text()
    assert 'sessionroute_admission_total{outcome="placed"} 1.0' in text
    assert 'sessionroute_admission_total{outcome="refused_full"} 1.0' in text
    assert "sessionroute_admission_waiting 0.0" in text


async def test_serve_refuses_a_request_that_waited_past_its_deadline(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router(  # the deadline is a timer of the core's, on the router's clock
        [b.url for b in backends[:1]],
        clock=MonotonicClock(),
        policy=f"{__name__}:InFlightGate",
        admission_max_wait_secs=0.05,
    )
    router.router.core.policy.config = GateConfig(max_in_flight=1)
    hold = asyncio.Event()
    backends[0].hold = hold
    first = asyncio.create_task(post_chat(client, router, "a"))
    while len(backends[0].seen) < 1:
        await asyncio.sleep(0.002)
    status, body = await post_chat(client, router, "b")
    assert status == 503 and body["error"]["code"] == "admission_timeout"
    assert len(router.router.core.admission) == 0
    hold.set()
    assert (await first)[0] == 200
    async with client.get(router.url + "/metrics") as r:  # the wait, by how it ended
        text = await r.text()
    assert 'sessionroute_admission_queue_wait_seconds_count{outcome="refused"} 1.0' in text
    assert 'sessionroute_admission_queue_wait_seconds_count{outcome="placed"} 0.0' in text
    assert "sessionroute_admission_wait_cap_seconds 0.05" in text


def test_the_simulator_holds_requests_at_the_router_and_loses_none() -> None:
    spec = SimSpec.model_validate({"workload": {"kind": "toy"}, "sim": {"sample_interval_s": 1}})
    gated = run_simulation(
        spec,
        f"{__name__}:InFlightGate",
        {"max_in_flight": 4},
        seed=0,
        wall_clock=ManualClock(),
    )
    free = run_simulation(spec, "least_loaded", seed=0, wall_clock=ManualClock())
    g, f = gated.metrics, free.metrics
    assert g["sessions_completed"] == f["sessions_completed"] == 48
    assert g["turns_in_flight_at_end"] == 0 and g["router_in_flight_at_end"] == 0

    def fleet_running(rows: list[dict[str, Any]]) -> int:
        by_t: dict[float, int] = {}
        for row in rows:
            by_t[row["t"]] = by_t.get(row["t"], 0) + row["running"]
        return max(by_t.values())

    assert fleet_running(gated.timeseries) <= 4 < fleet_running(free.timeseries)


class SessionGate(InFlightGate):
    """Admits a request only while no session is pinned (sticky placement otherwise)."""

    name: ClassVar[str] = "session_gate"

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        self.sticky = StickyLeastLoadedPolicy(
            StickyLeastLoadedConfig(session_ttl_s=10.0), clock=clock, rng=rng
        )

    def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
        return not self.sticky.session_counts()

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        return self.sticky.select(request, cluster)

    def sweep(self, now: float, limit: int | None = None) -> int:
        return self.sticky.sweep(now, limit)


def test_expired_sessions_free_capacity_for_a_waiting_request() -> None:
    clock = ManualClock()
    core = RoutingCore(SessionGate(clock=clock, rng=random.Random(0)), Cluster(W))
    ready: list[Ticket] = []
    first = core.place(RouteRequest(session_id="s1"), ready.append)
    assert isinstance(first, Reservation)
    core.complete(first)  # nothing in flight, but s1 stays pinned
    waiting = core.place(RouteRequest(session_id="s2"), ready.append)
    assert isinstance(waiting, Ticket)
    clock.advance(11.0)
    assert core.sweep(clock.now()) == 1  # s1 expires...
    assert ready == [waiting] and waiting.reservation is not None  # ...and s2 is placed


class ClockGate(InFlightGate):
    """Admits once the clock has passed ``open_at`` seconds: admission that changes without
    any request completing."""

    name: ClassVar[str] = "clock_gate"
    open_at: ClassVar[float] = 5.0

    def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
        return self.clock.now() >= self.open_at


async def test_serve_places_the_waiting_head_before_a_new_request_when_the_gate_opens(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    """The gate opened with time, with no completion to pump the queue: the next request's
    ``place`` admits the waiting head first, then routes the new one."""
    clock = ManualClock()
    router = await make_router(
        [b.url for b in backends[:1]], clock=clock, policy=f"{__name__}:ClockGate"
    )
    core = router.router.core
    core.log = []
    first = asyncio.create_task(post_chat(client, router, "a"))
    while len(core.admission) < 1:
        await asyncio.sleep(0.002)
    clock.advance(10.0)  # the gate opens; nothing completes to pump the queue
    assert (await post_chat(client, router, "b"))[0] == 200
    assert (await first)[0] == 200
    assert [sid for sid, _, _ in core.log] == ["a", "b"]  # the waiting head placed first
    assert sorted(s or "" for s in backends[0].sessions()) == ["a", "b"]
    assert core.cluster.in_flight(backends[0].url) == 0 and len(core.admission) == 0


class RecheckClockGate(ClockGate):
    """A clock gate that asks the drivers to re-examine waiting requests every 20 ms."""

    name: ClassVar[str] = "recheck_clock_gate"
    admission_recheck_s: float | None = 0.02


async def test_serve_rechecks_a_waiting_request_in_real_time(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    """The gate opens with time alone and no other request arrives: the waiting request is
    re-examined every ``admission_recheck_s`` and placed (not after the 60 s deadline)."""
    clock = ManualClock()
    router = await make_router(
        [b.url for b in backends[:1]], clock=clock, policy=f"{__name__}:RecheckClockGate"
    )
    core = router.router.core
    first = asyncio.create_task(post_chat(client, router, "a"))
    while len(core.admission) < 1:
        await asyncio.sleep(0.002)
    clock.advance(10.0)
    assert (await asyncio.wait_for(first, 5.0))[0] == 200
    assert core.admission.admitted_after_wait == 1


def test_a_held_request_does_not_block_one_the_policy_admits() -> None:
    """A policy that holds one session's turns: later turns of other sessions pass it."""

    class HoldS1(InFlightGate):
        def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
            return request.session_id != "s1" or self.clock.now() >= 5.0

    clock = ManualClock()
    core = RoutingCore(HoldS1(GateConfig(100), clock=clock, rng=random.Random(0)), Cluster(W))
    ready: list[Ticket] = []
    held = core.place(RouteRequest(session_id="s1"), ready.append)
    passed = core.place(RouteRequest(session_id="s2"), ready.append)
    assert isinstance(held, Ticket) and isinstance(passed, Reservation)
    core.complete(passed)  # pumps: s1 still held
    assert held.waiting
    clock.advance(5.0)
    core.recheck()
    assert ready == [held] and held.reservation is not None
