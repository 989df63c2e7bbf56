"""Retries, dead workers, health-check failover, circuit breaker, timeouts (scenarios 4-6)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from sessionroute.clock import ManualClock, MonotonicClock

from .backend import FakeBackend
from .conftest import MakeRouter, post_chat


async def test_scenario4_retry_503_twice_then_200(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    b.fail_statuses = [503, 503]
    router = await make_router([b.url])
    status, body = await post_chat(client, router, "r-1")
    assert status == 200 and body["object"] == "chat.completion"
    assert len(b.seen) == 3
    metrics = router.router.metrics.render().decode()
    assert f'sessionroute_retries_total{{worker="{b.url}"}} 2.0' in metrics


@pytest.mark.parametrize("code", [400, 404, 501])
async def test_scenario4_client_errors_pass_through_after_one_attempt(
    code: int,
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
) -> None:
    b = backends[0]
    b.fail_statuses = [code]
    router = await make_router([b.url])
    status, body = await post_chat(client, router, "r-2")
    assert status == code
    assert body == {"error": {"message": f"injected {code}", "type": "x", "code": code}}
    assert len(b.seen) == 1


async def test_retries_exhausted_pass_the_last_upstream_error_through(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    b.fail_statuses = [503] * 10
    router = await make_router([b.url], retry_max_retries=3)
    status, body = await post_chat(client, router, "r-3")
    assert status == 503 and body["error"]["message"] == "injected 503"
    assert len(b.seen) == 3
    router2 = await make_router([b.url], disable_retries=True)
    status, _ = await post_chat(client, router2, "r-3")
    assert status == 503 and len(b.seen) == 4


async def test_requests_every_worker_fails_do_not_open_every_circuit(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    """A review found three bad requests (each answered 500 by every worker, retried five
    times) opened both workers' circuits, and every client got 503 for the circuit timeout.
    Circuits open only while half the workers stay available: good requests are served as
    soon as the workers answer them."""
    a, b = backends[0], backends[1]
    router = await make_router(
        [a.url, b.url],
        policy="consistent_hash",
        retry_max_retries=5,
        cb_failure_threshold=3,
        cb_keep_half_available=True,
    )
    a.fail_statuses = [500] * 100
    b.fail_statuses = [500] * 100
    for _ in range(3):
        assert (await post_chat(client, router, "poison"))[0] == 500
    assert len(a.seen) + len(b.seen) == 3 * 5  # every attempt went out
    core = router.router.core
    assert [core.cluster.is_healthy(w.url) for w in (a, b)].count(True) == 1
    a.fail_statuses.clear()
    b.fail_statuses.clear()
    assert (await post_chat(client, router, "good"))[0] == 200

    alone = await make_router(
        [a.url], retry_max_retries=5, cb_failure_threshold=3, cb_keep_half_available=True
    )
    a.fail_statuses = [500] * 100
    for _ in range(3):
        assert (await post_chat(client, alone, "poison"))[0] == 500
    assert alone.router.core.cluster.is_healthy(a.url)  # a lone worker's circuit stays shut
    a.fail_statuses.clear()
    assert (await post_chat(client, alone, "good"))[0] == 200


async def test_by_default_the_breaker_opens_as_vllm_routers(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    """vllm-router's breaker (the default): a one-worker fleet's circuit opens at the
    threshold, and clients then get fast 503s instead of the worker's 500s."""
    a = backends[0]
    alone = await make_router([a.url], retry_max_retries=1, cb_failure_threshold=3)
    a.fail_statuses = [500] * 100
    assert [(await post_chat(client, alone, "p"))[0] for _ in range(5)] == [500] * 3 + [503] * 2
    assert len(a.seen) == 3
    two = await make_router([a.url, backends[1].url], retry_max_retries=1, cb_failure_threshold=2)
    backends[1].fail_statuses = [500] * 100
    statuses = [(await post_chat(client, two, None))[0] for _ in range(6)]
    assert statuses[-1] == 503 and two.router.core.cluster.healthy() == ()


async def test_a_circuit_timer_that_fires_early_is_armed_again(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    """uvloop's timers can fire up to a millisecond early: the circuit is then still open,
    and one timer left a healthy worker out of rotation for good (found by a review). The
    router's one timer runs the core's due timers and arms itself again at the core's next
    deadline, so an early firing runs nothing and the circuit's deadline stays armed."""
    clock = ManualClock()
    a, b = backends[0], backends[1]
    running = await make_router(
        [a.url, b.url],
        clock=clock,
        cb_failure_threshold=1,
        cb_timeout_duration_secs=30.0,
        session_sweep_interval_secs=3600.0,
        health_check_interval_secs=3600.0,
    )
    router = running.router
    router.core.record_failure(a.url)
    assert not router.core.cluster.is_healthy(a.url) and router.timers.due == 30.0
    clock.advance(29.9995)  # the timer fires half a millisecond early
    router.timers.fire()
    assert not router.core.cluster.is_healthy(a.url)
    assert router.timers.timer is not None and router.timers.due == 30.0  # armed again
    clock.advance(0.001)
    router.timers.fire()
    assert router.core.cluster.is_healthy(a.url) and router.timers.due == 3600.0


@pytest.mark.parametrize("policy", ["consistent_hash", "sticky_least_loaded"])
async def test_scenario5_killed_worker(
    policy: str,
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
) -> None:
    router = await make_router([b.url for b in backends], policy=policy)
    for i in range(30):
        await post_chat(client, router, f"k-{i}")
    before = {s: i for i, b in enumerate(backends) for s in b.sessions()}
    victim = backends[1]
    await victim.kill()
    for b in backends:
        b.seen.clear()
    for i in range(30):
        status, _ = await post_chat(client, router, f"k-{i}")
        assert status == 200  # re-placed on the next attempt: the client sees no error
    after = {s: i for i, b in enumerate(backends) for s in b.sessions()}
    assert len(after) == 30
    for sid, idx in before.items():
        if idx != 1:
            assert after[sid] == idx, sid  # other sessions never move
        else:
            assert after[sid] != 1
    assert not router.router.core.cluster.is_healthy(victim.url)
    async with client.get(router.url + "/health") as r:
        assert r.status == 503
        assert (await r.json())["unhealthy_workers"] == [victim.url]
    # Every worker down: 503 on generation routes and on /readiness.
    await backends[0].kill()
    await backends[2].kill()
    for i in range(3):
        status, body = await post_chat(client, router, f"k-{i}")
        assert status == 503, body
        assert body["error"]["code"] == "no_worker_available"
    async with client.get(router.url + "/readiness") as r:
        assert r.status == 503
        assert await r.json() == {"status": "not_ready", "healthy_workers": 0, "total_workers": 3}
    async with client.get(router.url + "/v1/models") as r:
        assert r.status == 503


async def test_scenario6_health_check_failover(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends], policy="sticky_least_loaded")
    checker = router.router.health
    assert checker is not None
    while checker.rounds < 1:  # the startup round
        await checker.round_done.wait()
    for i in range(9):
        await post_chat(client, router, f"h-{i}")
    sick = backends[0]
    moved = [s for s in sick.sessions() if s]
    assert moved
    sick.health_ok = False
    for n in range(3):
        assert router.router.core.cluster.is_healthy(sick.url), n
        await checker.check_once()
    assert not router.router.core.cluster.is_healthy(sick.url)
    sick.seen.clear()
    for sid in moved:
        assert (await post_chat(client, router, sid))[0] == 200
    assert sick.seen == []  # still serving, but unhealthy: its sessions went elsewhere
    new_home = {sid: i for i, b in enumerate(backends) for sid in b.sessions() if sid in moved}
    sick.health_ok = True
    await checker.check_once()
    assert not router.router.core.cluster.is_healthy(sick.url)  # needs 2 passes
    await checker.check_once()
    assert router.router.core.cluster.is_healthy(sick.url)
    for sid in moved:  # moved sessions stay on their new worker when the old one returns
        await post_chat(client, router, sid)
    assert sick.seen == []
    assert all(new_home[sid] != 0 for sid in moved)


async def test_periodic_health_checks_run(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    b = backends[0]
    router = await make_router(  # the core's timers run on the router's clock: a real one
        [b.url, backends[1].url],
        clock=MonotonicClock(),
        health_check_interval_secs=0.01,
        health_failure_threshold=2,
    )
    b.health_ok = False  # up at startup (a worker never up is unhealthy from the start)
    checker = router.router.health
    assert checker is not None
    for _ in range(50):
        if not router.router.core.cluster.is_healthy(b.url):
            break
        await asyncio.wait_for(checker.round_done.wait(), 5)
    assert not router.router.core.cluster.is_healthy(b.url)
    assert b.health_checks >= 2


async def test_circuit_breaker_opens_and_recovers(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    clock = ManualClock()
    b = backends[0]
    router = await make_router(
        [b.url, backends[1].url],
        clock=clock,
        policy="least_loaded",
        disable_retries=True,
        cb_failure_threshold=2,
        cb_success_threshold=1,
        cb_timeout_duration_secs=30.0,
    )
    b.fail_statuses = [500, 500]
    statuses = [(await post_chat(client, router, None))[0] for _ in range(4)]
    assert statuses.count(500) == 2
    assert not router.router.core.cluster.is_healthy(b.url)
    assert f'sessionroute_circuit_state{{worker="{b.url}"}} 1.0' in (
        router.router.metrics.render().decode()
    )
    clock.advance(30.0)
    router.router.core.refresh(b.url)  # what the breaker's timer does after the timeout
    assert router.router.core.cluster.is_healthy(b.url)  # half-open: may be tried again
    n = len(b.seen)
    for _ in range(4):
        assert (await post_chat(client, router, None))[0] == 200
    assert len(b.seen) > n


async def test_upstream_timeout_is_504(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    b.hold = asyncio.Event()  # never set
    router = await make_router([b.url], request_timeout_secs=0.2)
    status, body = await post_chat(client, router, "t-1")
    assert status == 504 and body["error"]["code"] == "upstream_timeout"
    assert router.router.core.cluster.in_flight(b.url) == 0


@pytest.fixture
async def slammer() -> AsyncIterator[str]:
    """A TCP server that passes health checks (a GET) and closes every other connection at
    once (a worker counts healthy only after a passing check)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if (await reader.read(3)) == b"GET":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.close()
    await server.wait_closed()


async def test_unreachable_after_retries_is_502(
    slammer: str, make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    # The worker closed after the request was written: retried, as vllm-router does, until
    # the attempts run out ...
    router = await make_router([slammer], retry_max_retries=3)
    status, body = await post_chat(client, router, "u-1")
    assert status == 502 and body["error"]["code"] == "upstream_unreachable"
    assert "3 attempt" in body["error"]["message"]
    assert router.router.core.cluster.in_flight(slammer) == 0
    # ... or surfaced at once when the operator wants no generation to run twice
    strict = await make_router([slammer], retry_max_retries=3, retry_after_send=False)
    status, body = await post_chat(client, strict, "u-1")
    assert status == 502 and body["error"]["code"] == "upstream_error"
    assert "not retried" in body["error"]["message"]
    assert strict.router.metrics.retries == {}


async def test_an_unhealthy_worker_is_rechecked_between_rounds(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    """A worker that is down when the router starts (marked unhealthy) is back soon after it
    comes up: unhealthy workers are checked every --health-recheck-interval-secs, not only
    every --health-check-interval-secs (60 s here)."""
    b = backends[0]
    b.health_ok = False
    router = await make_router(
        [b.url, backends[1].url],
        clock=MonotonicClock(),
        health_check_interval_secs=60.0,
        health_recheck_interval_secs=0.02,
        health_failure_threshold=1,
    )
    checker = router.router.health
    assert checker is not None
    while checker.rounds < 1:  # the startup round marks it unhealthy
        await checker.round_done.wait()
    assert not router.router.core.cluster.is_healthy(b.url)
    checks = backends[1].health_checks
    b.health_ok = True
    for _ in range(250):
        if router.router.core.cluster.is_healthy(b.url):
            break
        await asyncio.sleep(0.02)
    assert router.router.core.cluster.is_healthy(b.url)
    assert checker.rounds == 1  # no full round ran: only the unhealthy worker was checked
    assert backends[1].health_checks == checks
