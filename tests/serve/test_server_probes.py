"""Startup and probes: waiting for workers, /liveness, /readiness, /health (issue 40).

A worker counts healthy only after a passing check; one never started keeps ``/readiness`` at
503 until it comes up and passes its first check, and the router exits (status 1) when no
worker came up within ``--worker-startup-timeout-secs``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys

import aiohttp
import pytest

from sessionroute.serve import RouterSettings
from sessionroute.serve.probes import StartupTimeout
from sessionroute.serve.runner import serve

from .backend import FakeBackend, start_backends
from .conftest import FAST, MakeRouter, post_chat


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _get(client: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with client.get(url) as r:
        return r.status, await r.text()


async def test_never_started_worker_is_not_ready_until_its_first_passing_check(
    make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    router = await make_router(
        [url],
        worker_startup_check_interval=0.02,
        health_recheck_interval_secs=3600.0,  # only the startup wait checks it
        health_success_threshold=5,  # does not apply to a worker's first passing check
    )
    assert (await _get(client, router.url + "/liveness"))[0] == 200
    status, body = await _get(client, router.url + "/readiness")
    assert status == 503 and '"healthy_workers":0' in body.replace(" ", "")
    assert (await post_chat(client, router, "s"))[0] == 503
    backend = await FakeBackend(port=port).start()
    try:
        for _ in range(500):  # the startup wait's next check (every 20 ms)
            if backend.health_checks:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)  # the check's result is folded in on the loop
        for _ in range(100):
            if router.router.core.cluster.is_healthy(url):
                break
            await asyncio.sleep(0.01)
        assert backend.health_checks <= 2  # one passing check made it healthy
        status, body = await _get(client, router.url + "/readiness")
        assert status == 200, body
        assert (await post_chat(client, router, "s"))[0] == 200
        assert (await _get(client, router.url + "/health"))[0] == 200
    finally:
        await backend.kill()


async def test_no_503_while_a_healthy_worker_exists(
    make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    """One worker up, one never started: every request is served (none waits for, or is
    sent to, the worker that never passed a check); /health says 503, /readiness 200."""
    (up,) = await start_backends(1)
    down = f"http://127.0.0.1:{_free_port()}"
    try:
        router = await make_router([down, up.url], worker_startup_check_interval=0.05)
        statuses = [(await post_chat(client, router, f"n-{i}"))[0] for i in range(20)]
        assert statuses == [200] * 20
        assert (await _get(client, router.url + "/readiness"))[0] == 200
        assert (await _get(client, router.url + "/health"))[0] == 503
        assert (await _get(client, router.url + "/liveness"))[0] == 200
    finally:
        await up.kill()


async def test_one_of_three_killed_keeps_liveness_and_readiness(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends], policy="sticky_least_loaded")
    for i in range(6):
        assert (await post_chat(client, router, f"before-{i}"))[0] == 200
    await backends[1].kill()
    statuses = [(await post_chat(client, router, f"after-{i}"))[0] for i in range(30)]
    assert statuses == [200] * 30  # new sessions: no client error
    for i in range(6):  # old ones too (those on the dead worker re-placed)
        assert (await post_chat(client, router, f"before-{i}"))[0] == 200
    assert (await _get(client, router.url + "/liveness"))[0] == 200
    status, body = await _get(client, router.url + "/readiness")
    assert status == 200 and '"healthy_workers":2' in body.replace(" ", "")
    assert (await _get(client, router.url + "/health"))[0] == 503


async def test_serve_stops_when_no_worker_starts_in_time() -> None:
    settings = RouterSettings.build(
        **{
            **FAST,
            "worker_urls": (f"http://127.0.0.1:{_free_port()}",),
            "worker_startup_timeout_secs": 0.1,
            "worker_startup_check_interval": 0.02,
        }
    )
    with pytest.raises(StartupTimeout, match="--worker-startup-timeout-secs"):
        await asyncio.wait_for(serve(settings), 30)


async def test_startup_timeout_with_one_worker_up_keeps_serving(
    make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    (up,) = await start_backends(1)
    try:
        router = await make_router(
            [f"http://127.0.0.1:{_free_port()}", up.url],
            worker_startup_timeout_secs=0.05,
            worker_startup_check_interval=0.01,
        )
        startup = [t for t in router.router._tasks if t.get_name() == "sessionroute-startup"]
        assert len(startup) == 1
        await asyncio.wait_for(startup[0], 10)
        assert router.router.fatal_error is None
        assert (await post_chat(client, router, "x"))[0] == 200
    finally:
        await up.kill()


async def test_cli_exits_1_naming_the_workers_when_none_starts() -> None:
    dead = f"http://127.0.0.1:{_free_port()}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sessionroute.cli", "serve", "--port", "0",
        "--worker-urls", dead, "--worker-startup-timeout-secs", "0.2",
        "--worker-startup-check-interval", "0.05", "--log-level", "error",
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1
    assert dead in err.decode() and "--worker-startup-timeout-secs" in err.decode()
