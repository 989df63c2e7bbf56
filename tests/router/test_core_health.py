"""Worker availability in the router core: refused connections, circuits, health checks."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionroute.clock import ManualClock
from sessionroute.router import RouterConfig, RoutingCore
from sessionroute.router.actions import WorkerLost
from sessionroute.router.health import BreakerState, CircuitBreaker
from sessionroute.router.policies import create_policy
from sessionroute.router.state import Cluster

W = ["http://w1", "http://w2"]


def _core(clock: ManualClock, **config: object) -> RoutingCore:
    policy = create_policy("sticky_least_loaded", clock=clock)
    return RoutingCore(policy, Cluster(W), RouterConfig.model_validate(config))


def test_a_refused_connection_that_opens_the_circuit_sets_a_timer_for_half_open() -> None:
    clock = ManualClock()
    core = _core(clock, cb_failure_threshold=1, cb_timeout_s=20.0, health_success_threshold=1)
    assert core.record_unreachable("http://w2", "refused") == 20.0  # the circuit opened
    assert not core.cluster.is_healthy("http://w2")
    assert core.observe_check("http://w2", True) == (True, None)  # it came back, circuit open
    assert not core.cluster.is_healthy("http://w2")
    assert core.next_deadline() == 5.0  # the unhealthy worker's re-check comes first
    clock.advance(20.0)
    assert core.on_timer(19.999) == []  # the re-check: its checks pass, none to probe
    assert not core.cluster.is_healthy("http://w2")  # the circuit's timer is not due yet
    core.on_timer(20.0)
    assert core.cluster.is_healthy("http://w2")


def test_a_worker_failing_its_checks_is_lost_once() -> None:
    core = _core(ManualClock(), health_failure_threshold=2)
    assert core.observe_check("http://w1", False, "503") == (False, None)
    changed, lost = core.observe_check("http://w1", False, "503")
    assert changed and lost == WorkerLost("http://w1", "failed 2 health check(s)", 5.0)
    assert core.observe_check("http://w1", False) == (False, None)
    assert not core.cluster.is_healthy("http://w1") and core.health["http://w1"].last_error


def test_a_refused_connection_below_the_threshold_needs_only_the_checks() -> None:
    core = _core(ManualClock(), cb_failure_threshold=10)
    assert core.record_unreachable("http://w1", "refused") is None
    assert not core.cluster.is_healthy("http://w1")
    assert core.observe_check("http://w1", True) == (False, None)  # one pass of two
    assert core.observe_check("http://w1", True) == (True, None)
    assert core.cluster.is_healthy("http://w1")


def test_failures_open_the_circuit_once_and_a_success_resets_the_count() -> None:
    core = _core(ManualClock(), cb_failure_threshold=3, cb_timeout_s=5.0)
    assert [core.record_failure("http://w1") for _ in range(2)] == [None, None]
    core.record_success("http://w1")
    assert [core.record_failure("http://w1") for _ in range(3)] == [None, None, 5.0]
    assert not core.cluster.is_healthy("http://w1") and core.cluster.is_healthy("http://w2")


def test_circuits_open_only_while_half_of_the_workers_stay_available() -> None:
    """Failures every worker shares (a bad request repeated) must not open every circuit:
    with 2 workers one may open, with 4 two; the others keep counting, and open at once when
    enough workers are available again (a review switched a fleet off with three bad
    requests when every circuit could open)."""
    clock = ManualClock()
    core = _core(clock, cb_failure_threshold=2, cb_timeout_s=10.0, cb_keep_half_available=True)
    assert [core.record_failure("http://w1") for _ in range(2)] == [None, 10.0]
    assert [core.record_failure("http://w2") for _ in range(4)] == [None] * 4
    assert core.cluster.is_healthy("http://w2")  # the only one left
    clock.advance(10.0)
    core.refresh("http://w1")  # half-open: available again
    assert core.record_failure("http://w2") == 10.0  # counted all along: opens at once now
    assert not core.cluster.is_healthy("http://w2")

    four = [f"http://v{i}" for i in range(4)]
    policy = create_policy("round_robin", clock=clock)
    big = RoutingCore(
        policy, Cluster(four), RouterConfig(cb_failure_threshold=1, cb_keep_half_available=True)
    )
    opened = [big.record_failure(u) is not None for u in four]
    assert opened == [True, True, False, False]
    assert [big.cluster.is_healthy(u) for u in four] == [False, False, True, True]


def test_by_default_circuits_open_as_vllm_routers_do() -> None:
    """vllm-router's breaker: every worker's circuit opens at the threshold, the last one too
    (then requests get a fast 503 instead of the worker's errors)."""
    core = _core(ManualClock(), cb_failure_threshold=2, cb_timeout_s=10.0)
    for url in W:
        assert [core.record_failure(url) for _ in range(2)] == [None, 10.0]
    assert core.cluster.healthy() == ()


def test_a_circuit_timer_that_fires_early_runs_nothing_and_stays_set() -> None:
    """An event loop's timer may fire a millisecond before the circuit is due: the core runs
    nothing then and keeps its deadline (the driver re-arms at it); at the deadline exactly
    the circuit is half-open (the breaker compares the clock with that very deadline)."""
    clock = ManualClock(3.3)
    core = _core(clock, cb_failure_threshold=1, cb_timeout_s=10.1)
    assert core.record_failure("http://w1") == 10.1
    due = core.next_deadline()
    assert due == 3.3 + 10.1
    clock.advance(10.0995)
    assert core.on_timer(clock.now()) == [] and not core.cluster.is_healthy("http://w1")
    assert core.next_deadline() == due
    clock.set(due)
    core.on_timer(due)
    assert core.cluster.is_healthy("http://w1") and core.next_deadline() is None


def test_a_settled_breaker_skips_successes_and_a_failure_unsettles_it() -> None:
    """``settled`` (closed, no failure counted) lets the core skip the breaker on a success;
    any failure counted clears it until a success resets the count or closes the circuit."""
    clock = ManualClock()
    core = _core(clock, cb_failure_threshold=2, cb_success_threshold=1, cb_timeout_s=5.0)
    breaker = core.health["http://w1"].breaker
    assert breaker.settled
    assert core.record_success("http://w1") is False and breaker.settled
    assert core.record_failure("http://w1") is None and not breaker.settled
    assert core.record_success("http://w1") is False and breaker.settled
    assert [core.record_failure("http://w1") for _ in range(2)] == [None, 5.0]
    assert not breaker.settled and not core.cluster.is_healthy("http://w1")
    clock.advance(5.0)  # half-open; the success of a request still in flight closes it
    assert core.record_success("http://w1") is True
    assert breaker.settled and core.cluster.is_healthy("http://w1")


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.just(("success",)),
            st.tuples(st.just("failure"), st.booleans()),
            st.tuples(st.just("advance"), st.sampled_from([0.5, 2.0, 5.0])),
        ),
        max_size=40,
    ),
    enabled=st.booleans(),
)
def test_skipping_successes_on_a_settled_breaker_changes_no_state(
    ops: list[tuple[Any, ...]], enabled: bool
) -> None:
    """A breaker told of a success only when not ``settled`` goes through exactly the states
    of one told of every success (failures interleaved, half-open, closing; disabled too)."""
    clock = ManualClock()
    skipping, every = (
        CircuitBreaker(2, 2, 5.0, clock, enabled=enabled),
        CircuitBreaker(2, 2, 5.0, clock, enabled=enabled),
    )
    for op in ops:
        if op[0] == "success":
            changed = every.record_success()
            assert (not skipping.settled and skipping.record_success()) is changed
        elif op[0] == "failure":
            assert skipping.record_failure(may_open=op[1]) is every.record_failure(may_open=op[1])
        else:
            clock.advance(op[1])
        assert skipping.state is every.state
        assert skipping.reopens_in() == every.reopens_in()
        if skipping.settled:
            assert skipping.state is BreakerState.CLOSED
    if not enabled:
        assert every.state is BreakerState.CLOSED and skipping.settled


def test_unchecked_workers_are_unavailable_until_their_first_check_passes() -> None:
    """A live router does not know whether its workers are up: none is placed on before a
    check of it passes, and the first pass is enough (not ``health_success_threshold``)."""
    core = _core(ManualClock(), health_success_threshold=3)
    core.start_unchecked()
    assert core.cluster.healthy() == ()
    assert core.observe_check("http://w2", False) == (False, None)
    assert core.observe_check("http://w1", True) == (True, None)
    assert core.cluster.healthy() == ("http://w1",)


def test_ready_while_one_worker_is_available_and_healthy_only_when_all_are() -> None:
    """The probe verdicts ``serve`` answers: ``/readiness`` while one worker is available,
    ``/health`` (vllm-router's meaning) only when none is unavailable; a worker started
    unchecked counts unavailable until its first passing check."""
    core = _core(ManualClock(), cb_failure_threshold=1)
    core.start_unchecked()
    assert not core.ready() and core.unavailable_workers() == W
    core.observe_check("http://w2", True)
    assert core.ready() and core.unavailable_workers() == ["http://w1"]
    core.observe_check("http://w1", True)
    assert core.ready() and core.unavailable_workers() == []
    core.record_unreachable("http://w1", "refused")
    assert core.ready() and core.unavailable_workers() == ["http://w1"]
    core.record_unreachable("http://w2", "refused")
    assert not core.ready() and core.unavailable_workers() == W


def test_a_worker_back_from_a_crash_gets_its_open_circuit_half_open_when_asked() -> None:
    """``cb_half_open_on_recovery``: the checks bring the worker back, its circuit is probed at
    once (a failure opens it again); without it the circuit waits for its timeout (above)."""
    clock = ManualClock()
    core = _core(
        clock,
        cb_failure_threshold=1,
        cb_success_threshold=1,
        cb_timeout_s=60.0,
        health_success_threshold=1,
        cb_half_open_on_recovery=True,
    )
    assert core.record_unreachable("http://w2", "refused") == 60.0
    assert core.observe_check("http://w2", True) == (True, None)
    assert core.cluster.is_healthy("http://w2")
    assert core.health["http://w2"].breaker.state is BreakerState.HALF_OPEN
    assert core.record_failure("http://w2") == 60.0  # the probe failed: open again
    assert not core.cluster.is_healthy("http://w2")
    core.record_failure("http://w1")  # a worker that stayed healthy keeps its open circuit
    assert core.observe_check("http://w1", True) == (False, None)
    assert not core.cluster.is_healthy("http://w1")
