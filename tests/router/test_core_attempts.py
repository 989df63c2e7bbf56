"""The router core's decisions on an attempt's outcome, pure: an answer (relay or retry), an
answer that broke after its head (refuse 502/504 or cut), the first-byte deadline, and what
each records against the worker."""

from __future__ import annotations

import random

import pytest

from sessionroute.clock import ManualClock
from sessionroute.router import RouterConfig, RoutingCore
from sessionroute.router.actions import Refuse, Retry
from sessionroute.router.policies import create_policy
from sessionroute.router.retry import RETRY_STATUSES, AttemptFailure
from sessionroute.router.state import Cluster
from sessionroute.types import RouteRequest

W = ["http://w1", "http://w2"]


def _core(**config: object) -> RoutingCore:
    clock = ManualClock()
    policy = create_policy("sticky_least_loaded", clock=clock)
    return RoutingCore(
        policy, Cluster(W), RouterConfig.model_validate(config), rng=random.Random(1)
    )


def test_a_broken_answer_is_refused_502_and_a_timed_out_one_504_both_released() -> None:
    core = _core(cb_failure_threshold=2)
    broken = core.route(RouteRequest(session_id="a"))
    url = broken.worker
    refuse = core.answer_broke(broken, AttemptFailure.SENT, "connection reset")
    assert refuse == Refuse(
        502, "upstream_error", f"upstream {url} failed while sending its response: connection reset"
    )
    assert broken.done and core.cluster.in_flight(url) == 0
    assert core.cluster.is_healthy(url)  # one failure of two
    slow = core.route(RouteRequest(session_id="a"))
    assert slow.worker == url  # the session stays
    message = f"upstream {url} did not finish its response within 30.0 s"
    assert core.answer_broke(slow, AttemptFailure.TIMEOUT, message) == Refuse(
        504, "upstream_timeout", message
    )
    assert not core.cluster.is_healthy(url)  # the second failure opened its circuit


def test_a_cut_stream_counts_as_502_whatever_broke_it() -> None:
    core = _core()
    res = core.route(RouteRequest(session_id="a", stream=True))
    refuse = core.answer_broke(res, AttemptFailure.TIMEOUT, "no byte for 30 s", started=True)
    assert refuse.status == 502 and refuse.code == "upstream_error" and res.done


def test_an_answer_is_relayed_unless_its_status_is_retried_with_attempts_left() -> None:
    core = _core(retry_max_attempts=2, cb_failure_threshold=3)
    for status in (200, 400, 404, 501):
        assert not core.retries_answer(status, 1)
    for status in sorted(RETRY_STATUSES):
        assert core.retries_answer(status, 1) and not core.retries_answer(status, 2)
    res = core.route(RouteRequest(session_id="a"))
    assert core.attempt_answered(res, 200, 1) is None
    retry = core.attempt_answered(res, 503, 1)
    assert isinstance(retry, Retry) and retry.reservation is res and retry.after_s > 0
    assert core.attempt_answered(res, 503, 2) is None  # the last attempt's answer is relayed
    assert not res.done  # relaying and retrying keep the reservation
    assert core.attempt_answered(res, 501, 1) is None  # a failure, not retried
    assert not core.cluster.is_healthy(res.worker)  # 503, 503, 501: the circuit opened


def test_one_attempt_retries_no_answer() -> None:
    core = _core(retry_max_attempts=1)
    assert not any(core.retries_answer(status, 1) for status in RETRY_STATUSES)


@pytest.mark.parametrize(
    ("timeout_s", "stream", "expected"),
    [(0.0, True, None), (2.5, False, None), (2.5, True, 2.5)],
)
def test_only_streamed_requests_get_a_first_byte_deadline(
    timeout_s: float, stream: bool, expected: float | None
) -> None:
    core = _core(first_byte_timeout_s=timeout_s)
    assert core.first_byte_timeout_s(RouteRequest(session_id="a", stream=stream)) == expected


def test_the_circuit_hook_hears_an_opening_and_the_closing_successes() -> None:
    core = _core(cb_failure_threshold=1, cb_success_threshold=2, cb_timeout_s=10.0)
    heard: list[tuple[str, bool]] = []
    core.on_circuit = lambda url, opened: heard.append((url, opened))
    res = core.route(RouteRequest(session_id="a"))
    core.answer_broke(res, AttemptFailure.SENT, "reset")
    assert heard == [(res.worker, True)]
    core.clock.advance(10.0)  # type: ignore[attr-defined]
    core.on_timer(10.0)  # half-open: available for a trial request
    assert core.cluster.is_healthy(res.worker) and heard == [(res.worker, True)]
    again = core.route(RouteRequest(session_id="a"))
    assert again.worker == res.worker
    core.attempt_answered(again, 200, 1)
    assert heard == [(res.worker, True)]  # one success of two
    core.attempt_answered(again, 200, 1)
    assert heard == [(res.worker, True), (res.worker, False)]


def test_a_refused_connection_is_heard_once_and_a_circuit_it_opens_too() -> None:
    """``serve`` logs a worker that a request found unreachable (``on_unreachable``), once
    while it stays down, and the circuit that this opened (``on_circuit``), as for any other
    failure that opens one."""
    core = _core(cb_failure_threshold=2)
    lost: list[tuple[str, str]] = []
    circuits: list[tuple[str, bool]] = []
    core.on_unreachable = lambda url, reason: lost.append((url, reason))
    core.on_circuit = lambda url, opened: circuits.append((url, opened))
    res = core.route(RouteRequest(session_id="a"))
    url = res.worker
    action = core.attempt_failed(res, AttemptFailure.CONNECT, 1, "connection refused")
    assert isinstance(action, Retry) and not core.cluster.is_healthy(url)
    assert lost == [(url, "connection refused")] and circuits == []
    core.attempt_failed(res, AttemptFailure.CONNECT, 2, "connection refused")  # down already
    assert lost == [(url, "connection refused")]
    assert circuits == [(url, True)]  # the second failure of two opened its circuit
