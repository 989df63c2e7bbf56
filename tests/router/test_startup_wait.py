"""The wait for workers to pass a health check (:mod:`sessionroute.router.startup`)."""

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
