"""Worker availability in the router core: refused connections, circuits, health checks."""

from __future__ import annotations

from sessionroute.clock import ManualClock
from sessionroute.router import RouterConfig, RoutingCore
from sessionroute.router.policies import create_policy
from sessionroute.router.state import Cluster

W = ["http://w1", "http://w2"]


def _core(clock: ManualClock, **config: object) -> RoutingCore:
    policy = create_policy("sticky_least_loaded", clock=clock)
    return RoutingCore(policy, Cluster(W), RouterConfig.model_validate(config))


def test_a_refused_connection_that_opens_the_circuit_asks_for_a_refresh_at_half_open() -> None:
    clock = ManualClock()
    core = _core(clock, cb_failure_threshold=1, cb_timeout_s=20.0)
    assert core.record_unreachable("http://w2", "refused") == 20.0  # the circuit opened
    assert not core.cluster.is_healthy("http://w2")
    core.observe_check("http://w2", True, fail_n=3, pass_n=1)  # it came back, circuit open
    assert not core.cluster.is_healthy("http://w2")
    clock.advance(20.0)
    core.refresh("http://w2")  # what the drivers schedule with the returned 20 s
    assert core.cluster.is_healthy("http://w2")


def test_a_refused_connection_below_the_threshold_needs_only_the_checks() -> None:
    core = _core(ManualClock(), cb_failure_threshold=10)
    assert core.record_unreachable("http://w1", "refused") is None
    assert not core.cluster.is_healthy("http://w1")
    assert core.observe_check("http://w1", True, fail_n=3, pass_n=2) is False  # one pass of two
    assert core.observe_check("http://w1", True, fail_n=3, pass_n=2) is True
    assert core.cluster.is_healthy("http://w1")


def test_failures_open_the_circuit_once_and_a_success_resets_the_count() -> None:
    core = _core(ManualClock(), cb_failure_threshold=3, cb_timeout_s=5.0)
    assert [core.record_failure("http://w1") for _ in range(2)] == [None, None]
    core.record_success("http://w1")
    assert [core.record_failure("http://w1") for _ in range(3)] == [None, None, 5.0]
    assert not core.cluster.is_healthy("http://w1") and core.cluster.is_healthy("http://w2")


def test_the_last_available_workers_circuit_does_not_open() -> None:
    """Failures every worker shares (a bad request repeated) must not open every circuit:
    the last available worker's stay counted, and open it once another is available."""
    clock = ManualClock()
    core = _core(clock, cb_failure_threshold=2, cb_timeout_s=10.0)
    assert [core.record_failure("http://w1") for _ in range(2)] == [None, 10.0]
    assert [core.record_failure("http://w2") for _ in range(4)] == [None] * 4
    assert core.cluster.is_healthy("http://w2")  # the only one left
    clock.advance(10.0)
    core.refresh("http://w1")  # half-open: available again
    assert core.record_failure("http://w2") == 10.0  # counted all along: opens at once now
    assert not core.cluster.is_healthy("http://w2")


def test_a_retried_request_is_one_strike_per_reservation() -> None:
    from sessionroute.types import RouteRequest

    core = _core(ManualClock(), cb_failure_threshold=2, cb_timeout_s=10.0)
    res = core.route(RouteRequest(session_id="s"))
    assert [core.record_attempt_failure(res) for _ in range(5)] == [None] * 5
    assert core.cluster.is_healthy(res.worker)
    other = core.route(RouteRequest(session_id="s"))  # another request: a strike of its own
    assert core.record_attempt_failure(other) == 10.0
