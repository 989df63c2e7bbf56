"""The wait for workers to pass a health check (:mod:`sessionroute.router.startup`), the
worker-URL rule and a session's expiry, as serve reads them from the router."""

from __future__ import annotations

from sessionroute.router.config import RouterConfig
from sessionroute.router.startup import StartupWait


def test_checks_come_every_interval_and_the_last_one_at_the_timeout() -> None:
    wait = StartupWait(since=100.0, timeout_s=70.0, interval_s=30.0)
    assert wait.next_check_in(100.0) == 30.0
    assert wait.next_check_in(160.0) == 10.0  # the last check lands on the timeout
    assert wait.next_check_in(170.0) is None


def test_the_end_of_the_wait_is_fatal_only_when_no_worker_passed() -> None:
    assert StartupWait.outcome(0, 3) == "ready"
    assert StartupWait.outcome(2, 3) == "partial"
    assert StartupWait.outcome(3, 3) == "fatal"


def test_the_defaults_are_vllm_routers() -> None:
    config = RouterConfig()
    assert (config.worker_startup_timeout_s, config.worker_startup_check_interval_s) == (600, 30)


def test_a_worker_url_is_an_http_base_url_kept_as_given() -> None:
    from sessionroute.router.validate import worker_url_problem

    assert worker_url_problem("http://10.0.0.1:8000") is None
    assert worker_url_problem("https://h/") is None
    assert "http:// or https://" in (worker_url_problem("10.0.0.1:8000") or "")


def test_a_session_expires_its_ttl_after_its_last_turn() -> None:
    from sessionroute.router.state.sessions import SessionInfo

    info = SessionInfo("http://a", pinned_at=0.0, last_seen=100.0, turns=3, ttl_s=60.0)
    assert info.expires_in_s(130.0) == 30.0
    assert info.expires_in_s(200.0) == 0.0
