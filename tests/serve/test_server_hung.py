"""Hung workers (issue 19, item 1): a worker frozen with SIGSTOP accepts connections but never
answers. Its health checks fail, it is marked unhealthy, and the requests in flight on it are
cancelled there and placed again: the client sees no error. Real backend processes on
127.0.0.1 (the bench's zero-delay backend), stopped by PID."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import aiohttp
import pytest

from sessionroute.bench.backend import free_port
from sessionroute.clock import MonotonicClock
from sessionroute.types import DecisionKind

from .backend import FakeBackend, start_backends
from .conftest import JSON, MakeRouter, chat
from .test_server_upstream import RawBackend
from .test_server_upstream import raw as raw  # the fixture


@pytest.fixture
def processes() -> Iterator[list[str]]:
    """Three zero-delay backend processes; their URLs (the pids are in ``_PIDS``)."""
    procs: list[subprocess.Popen[bytes]] = []
    urls = []
    for _ in range(3):
        port = free_port()
        code = f"from sessionroute.bench.backend import backend_main; backend_main({port})"
        procs.append(subprocess.Popen([sys.executable, "-c", code]))
        urls.append(f"http://127.0.0.1:{port}")
    _PIDS[:] = [p.pid for p in procs]
    yield urls
    for p in procs:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait(10)


_PIDS: list[int] = []


async def _wait_up(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as client:
        for url in urls:
            for _ in range(200):
                try:
                    async with client.get(url + "/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"backend {url} did not start")


async def test_a_frozen_worker_costs_no_client_errors(
    processes: list[str], make_router: MakeRouter
) -> None:
    await _wait_up(processes)
    router = await make_router(  # the core's health-check timers run on a real clock
        processes,
        clock=MonotonicClock(),
        policy="sticky_least_loaded",
        health_check_interval_secs=0.2,
        health_recheck_interval_secs=0.2,
        health_check_timeout_secs=0.3,
        health_failure_threshold=2,
        expose_worker_header=True,
        request_timeout_secs=60.0,
    )
    served: dict[str, list[str]] = {f"s{i}": [] for i in range(50)}
    errors: list[tuple[str, int]] = []

    async def turn(client: aiohttp.ClientSession, sid: str) -> None:
        async with client.post(
            router.url + "/v1/chat/completions",
            json=chat(f"{sid} turn {len(served[sid])}"),
            headers={**JSON, "x-session-id": sid},
        ) as r:
            await r.read()
            if r.status != 200:
                errors.append((sid, r.status))
                return
            served[sid].append(r.headers["x-sessionroute-worker"])

    async def rest(client: aiohttp.ClientSession, sid: str) -> None:
        for _ in range(4):
            await turn(client, sid)
            await asyncio.sleep(0.02)

    async with aiohttp.ClientSession() as client:
        await asyncio.gather(*(turn(client, sid) for sid in served))
        first = {sid: w[0] for sid, w in served.items()}
        counts = {u: list(first.values()).count(u) for u in processes}
        victim = max(counts, key=lambda u: counts[u])
        on_victim = [sid for sid, w in first.items() if w == victim]
        assert on_victim
        running = asyncio.gather(*(rest(client, sid) for sid in served))
        await asyncio.sleep(0.01)  # turns are in flight: freeze one worker under them
        os.kill(_PIDS[processes.index(victim)], signal.SIGSTOP)
        await asyncio.wait_for(running, 60)

    assert errors == []
    assert all(len(w) == 5 for w in served.values())  # every session completed
    core = router.router.core
    assert not core.cluster.is_healthy(victim)
    for sid in on_victim:  # each moved off the frozen worker, once, and stayed where it went
        after = served[sid][served[sid].index(victim) + 1 :] if victim in served[sid] else []
        assert victim not in after[1:] and served[sid][-1] != victim
    assert core.decisions[DecisionKind.REPINNED] >= len(on_victim)
    assert all(core.cluster.in_flight(u) == 0 for u in processes)


async def test_first_byte_timeout_replaces_a_silent_stream(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    """A streaming request whose worker sends no head in time moves to another worker."""
    slow = backends[0]
    slow.hold = asyncio.Event()  # never set: the worker reads the request and says nothing
    router = await make_router(
        [b.url for b in backends[:2]], policy="round_robin", first_byte_timeout_secs=0.2
    )
    async with aiohttp.ClientSession() as client:
        for i in range(2):  # round robin: one of the two lands on the silent worker first
            async with client.post(
                router.url + "/v1/chat/completions",
                json=chat(stream=True),
                headers={**JSON, "x-session-id": f"ttfb-{i}"},
            ) as r:
                assert r.status == 200
                assert (await r.read()).endswith(b"data: [DONE]\n\n")
        assert len(slow.seen) == 1 and len(backends[1].seen) == 2
        assert not router.router.core.cluster.is_healthy(slow.url)
        slow.hold.set()


async def test_a_request_that_reached_the_worker_is_sent_twice_only_when_allowed(
    raw: RawBackend,
    make_router: MakeRouter,
) -> None:
    """The worker read the whole request, then the connection broke: retried as vllm-router
    retries it (the default); with --no-retry-after-send that attempt may have started a
    generation, so it is surfaced as a 502 after one attempt."""
    raw.respond = lambda head: (b"", True)  # read it all, then close without an answer
    router = await make_router([raw.url], retry_max_retries=5, retry_after_send=False)
    async with aiohttp.ClientSession() as client:
        async with client.post(router.url + "/v1/chat/completions", json=chat()) as r:
            assert r.status == 502
            assert "--retry-after-send" in (await r.json())["error"]["message"]
        assert len(raw.heads) == 1
        again = await make_router([raw.url], retry_max_retries=3)
        async with client.post(again.url + "/v1/chat/completions", json=chat()) as r:
            assert r.status == 502
        assert len(raw.heads) == 1 + 3  # every attempt went out


async def test_a_worker_that_closes_before_reading_is_retried(make_router: MakeRouter) -> None:
    """Connections refused (nothing sent) are retried on another worker, as before."""
    dead = f"http://127.0.0.1:{free_port()}"
    live = await start_backends(1)
    try:
        router = await make_router([dead, live[0].url], policy="round_robin")
        async with aiohttp.ClientSession() as client:
            for i in range(4):
                async with client.post(
                    router.url + "/v1/chat/completions",
                    json=chat(),
                    headers={**JSON, "x-session-id": f"r{i}"},
                ) as r:
                    assert r.status == 200
        assert len(live[0].seen) == 4
    finally:
        await live[0].kill()
