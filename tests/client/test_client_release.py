"""The releaser never fails its caller: bounded retries on 5xx/transport errors, none on 4xx.

Time bounds use a short configured budget (0.5 s) and a generous margin; they check that the
bound holds, not how fast anything is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from test_client_fakes import FakeRouter, closed_port_url, fake_router

from sessionroute.client import ReleasePolicy, SessionReleaser, SyncSessionReleaser
from sessionroute.client.release import resolve_release
from sessionroute.errors import ConfigError

BUDGET_S = 0.5
MARGIN_S = 1.5
FAST = ReleasePolicy(
    attempt_timeout_s=0.2, total_timeout_s=BUDGET_S, max_attempts=1000, initial_backoff_s=0.01
)


async def test_release_succeeds_once() -> None:
    async with fake_router() as router, SessionReleaser(router.url + "/v1") as releaser:
        assert await releaser.finish_session("sess 1/é") is True
        assert router.finishes == ["sess 1/é"]
        assert (releaser.succeeded, releaser.failed, releaser.attempts) == (1, 0, 1)


async def test_5xx_is_retried_until_success() -> None:
    async with fake_router() as router, SessionReleaser(router.url, policy=FAST) as releaser:
        router.finish_statuses = [500, 502, 503]
        assert await releaser.finish_session("s") is True
        assert router.finishes == ["s"] * 4


async def test_5xx_retries_stop_at_max_attempts() -> None:
    policy = ReleasePolicy(max_attempts=3, initial_backoff_s=0.001)
    async with fake_router() as router, SessionReleaser(router.url, policy=policy) as releaser:
        router.finish_statuses = [500] * 10
        assert await releaser.finish_session("s") is False
        assert router.finishes == ["s"] * 3
        assert (releaser.failed, releaser.attempts) == (1, 3)


@pytest.mark.parametrize("status", [400, 401, 404, 405])
async def test_4xx_is_not_retried(status: int) -> None:
    async with fake_router() as router, SessionReleaser(router.url, policy=FAST) as releaser:
        router.finish_statuses = [status, 200]
        assert await releaser.finish_session("s") is False
        assert router.finishes == ["s"]


async def test_dead_router_is_bounded_and_retried() -> None:
    async with SessionReleaser(closed_port_url(), policy=FAST) as releaser:
        start = time.monotonic()
        assert await releaser.finish_session("s") is False
        elapsed = time.monotonic() - start
    assert elapsed < BUDGET_S + MARGIN_S
    assert releaser.attempts > 1


async def test_hanging_router_is_bounded_for_many_ids() -> None:
    ids = [f"s{i}" for i in range(8)]
    async with fake_router() as router:
        router.finish_hang = True
        async with SessionReleaser(router.url, policy=FAST) as releaser:
            start = time.monotonic()
            result = await releaser.finish_sessions(ids)
            elapsed = time.monotonic() - start
        assert result == dict.fromkeys(ids, False)
        assert router.finishes  # the small pool lets only some reach the router in time
    # One shared bound, not one per id (sequential would take 8 * 0.5 s).
    assert elapsed < BUDGET_S + MARGIN_S


async def test_cancelled_caller_does_not_cancel_the_release() -> None:
    async with fake_router() as router:
        router.finish_hang = True
        releaser = SessionReleaser(router.url)
        task = asyncio.create_task(releaser.finish_session("s"))
        await router.finish_started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        router.unblock.set()
        await releaser.aclose()  # waits for the release still in flight
        assert (releaser.succeeded, releaser.failed) == (1, 0)
        assert router.finishes == ["s"]


async def test_closed_releaser_skips_without_raising() -> None:
    async with fake_router() as router:
        releaser = SessionReleaser(router.url)
        await releaser.aclose()
        await releaser.aclose()
        assert await releaser.finish_session("s") is False
        assert router.finishes == []


async def test_failures_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sessionroute.client")
    async with fake_router() as router, SessionReleaser(router.url) as releaser:
        router.finish_statuses = [404]
        await releaser.finish_session("sess-404")
    failures = [r for r in caplog.records if "could not release" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].levelno == logging.DEBUG
    assert "sess-404" in failures[0].getMessage() and "HTTP 404" in failures[0].getMessage()


async def test_sync_releaser_retries_5xx_not_4xx() -> None:
    def run(router: FakeRouter) -> tuple[bool, bool]:
        with SyncSessionReleaser(router.url, policy=FAST) as releaser:
            router.finish_statuses = [503, 200, 400]
            return releaser.finish_session("a"), releaser.finish_session("b")

    async with fake_router() as router:
        assert await asyncio.to_thread(run, router) == (True, False)
        assert router.finishes == ["a", "a", "b"]


async def test_sync_releaser_hanging_router_is_bounded_for_many_ids() -> None:
    def run(router: FakeRouter) -> dict[str, bool]:
        with SyncSessionReleaser(router.url, policy=FAST) as releaser:
            return releaser.finish_sessions(["a", "b", "c", "d", "e", "f"])

    async with fake_router() as router:
        router.finish_hang = True
        start = time.monotonic()
        result = await asyncio.to_thread(run, router)
        elapsed = time.monotonic() - start
        assert set(result.values()) == {False}
    assert elapsed < BUDGET_S + MARGIN_S


def test_sync_releaser_dead_router_is_bounded() -> None:
    with SyncSessionReleaser(closed_port_url(), policy=FAST) as releaser:
        start = time.monotonic()
        assert releaser.finish_session("s") is False
        elapsed = time.monotonic() - start
    assert elapsed < BUDGET_S + MARGIN_S
    assert releaser.attempts > 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("attempt_timeout_s", 0.0),
        ("total_timeout_s", -1.0),
        ("max_attempts", 0),
        ("backoff_multiplier", 0.5),
        ("jitter", 1.5),
    ],
)
def test_bad_policy_is_rejected_by_name(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        kwargs: dict[str, Any] = {field: value}
        ReleasePolicy(**kwargs)


def test_bad_pool_size_is_rejected() -> None:
    with pytest.raises(ConfigError, match="max_connections"):
        SyncSessionReleaser("http://127.0.0.1:1", max_connections=0)


def test_unknown_release_setting_means_release() -> None:
    assert (resolve_release(None), resolve_release(True), resolve_release(False)) == (
        True,
        True,
        False,
    )
