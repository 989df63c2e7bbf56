"""vllm-router's rate limit in the router core: a token bucket in front of placement, its queue
on the admission queue (issue 40)."""

from __future__ import annotations

import pytest

from sessionroute.clock import ManualClock
from sessionroute.errors import AdmissionRefused
from sessionroute.router import RouterConfig, RoutingCore
from sessionroute.router.admission import Ticket
from sessionroute.router.core import Reservation
from sessionroute.router.policies import create_policy
from sessionroute.router.ratelimit import TokenBucket
from sessionroute.router.state import Cluster
from sessionroute.types import RouteRequest


def test_token_bucket_refills_and_caps() -> None:
    b = TokenBucket(2, 1.0, now=0.0)
    assert [b.take(0.0) for _ in range(3)] == [True, True, False]
    assert b.wait_s(0.0) == pytest.approx(1.0)
    assert b.take(1.0) and not b.take(1.0)
    b.give_back()
    b.give_back()
    b.give_back()
    assert b.tokens == 2  # never above the capacity


def _core(clock: ManualClock, **config: object) -> RoutingCore:
    policy = create_policy("round_robin", clock=clock)
    return RoutingCore(
        policy, Cluster(["http://w1", "http://w2"]), RouterConfig.model_validate(config)
    )


def _req(i: int) -> RouteRequest:
    return RouteRequest(None, 10, None, None, f"r{i}")


def test_no_token_queues_then_a_completion_places_the_oldest() -> None:
    clock = ManualClock()
    core = _core(clock, rate_limit_capacity=1, rate_limit_per_s=0.001, admission_max_waiting=1)
    first = core.place(_req(0), lambda t: None)
    assert isinstance(first, Reservation) and first.token
    ready: list[Ticket] = []
    second = core.place(_req(1), ready.append)
    assert isinstance(second, Ticket)
    with pytest.raises(AdmissionRefused) as full:
        core.place(_req(2), lambda t: None)
    assert (full.value.status, full.value.retry_after_s) == (429, 1)
    core.complete(first)  # gives its token back: the waiting one is placed
    assert ready == [second] and second.reservation is not None and second.reservation.token
    core.complete(second.reservation)
    assert core.limiter is not None and core.limiter.tokens == 1


def test_a_queue_timeout_is_a_408_and_refill_serves_the_queue_only_at_an_event() -> None:
    clock = ManualClock()
    core = _core(clock, rate_limit_capacity=1, rate_limit_per_s=2.0, admission_max_wait_s=1.0)
    held = core.place(_req(0), lambda t: None)
    ticket = core.place(_req(1), lambda t: None)
    assert isinstance(held, Reservation) and isinstance(ticket, Ticket)
    assert core.admission_recheck_s is None  # no timer for the refill (vllm-router's queue):
    assert core.next_deadline() == pytest.approx(1.0)  # the ticket's deadline comes first
    clock.advance(0.5)  # a token refilled; the next event serves the queue
    assert ticket.waiting
    late = core.place(_req(2), lambda t: None)  # an arrival: the oldest gets the token first
    assert isinstance(late, Ticket) and ticket.reservation is not None and late.waiting
    refused = core.withdraw(late)
    assert refused is not None and refused.status == 408


def test_queue_size_zero_refuses_at_once_and_no_limit_by_default() -> None:
    core = _core(ManualClock(), rate_limit_capacity=1, admission_max_waiting=0)
    core.place(_req(0), lambda t: None)
    with pytest.raises(AdmissionRefused) as exc:
        core.place(_req(1), lambda t: None)
    assert exc.value.status == 429
    assert _core(ManualClock()).limiter is None


def test_a_moved_request_keeps_its_token() -> None:
    clock = ManualClock()
    core = _core(clock, rate_limit_capacity=2, rate_limit_per_s=0.001)
    r = core.place(_req(0), lambda t: None)
    assert isinstance(r, Reservation)
    core.set_health(r.worker, False)
    moved = core.retarget(r)
    assert moved.worker != r.worker and moved.token and not r.token
    assert core.limiter is not None and core.limiter.tokens == pytest.approx(1, abs=0.01)
    core.complete(moved)
    assert core.limiter.tokens == pytest.approx(2, abs=0.01)
