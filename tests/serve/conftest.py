"""Fixtures for the live-router tests: fake backends, routers and a client, all on 127.0.0.1."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest

from sessionroute.clock import Clock, ManualClock
from sessionroute.serve import RouterSettings, RunningRouter, start_router

from .backend import FakeBackend, start_backends
from .redis_server import RedisServer, redis_binary

MakeRouter = Callable[..., Awaitable[RunningRouter]]

FAST: dict[str, Any] = {
    "port": 0,
    "health_check_interval_secs": 3600.0,
    "retry_initial_backoff_ms": 1.0,
    "retry_max_backoff_ms": 5.0,
    "shutdown_timeout_secs": 1.0,
    "scrape_interval_secs": 0,
}
"""Router settings for tests: free port, no periodic health checks or gauge scrapes,
millisecond backoff."""


JSON = {"Content-Type": "application/json"}
"""The request header every generation request needs (415 without it, as vllm-router)."""


@pytest.fixture
async def backends() -> AsyncIterator[list[FakeBackend]]:
    bs = await start_backends(3)
    yield bs
    for b in bs:
        await b.kill()


@pytest.fixture
async def make_router() -> AsyncIterator[MakeRouter]:
    started: list[RunningRouter] = []

    async def make(
        workers: list[str], *, clock: Clock | None = None, **overrides: Any
    ) -> RunningRouter:
        values = {**FAST, "worker_urls": tuple(workers), **overrides}
        running = await start_router(
            RouterSettings.build(**values),
            clock=clock if clock is not None else ManualClock(),
            rng=random.Random(0),
        )
        started.append(running)
        return running

    yield make
    for r in started:
        await r.stop()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, stopped by PID after the test (skips when
    the binary is not installed)."""
    binary = redis_binary()
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    server = RedisServer(binary).start()
    yield server
    server.kill()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def chat(content: str = "hello", **extra: Any) -> dict[str, Any]:
    """A chat completion request body."""
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], **extra}


async def post_chat(
    client: aiohttp.ClientSession,
    router: RunningRouter,
    session: str | None,
    path: str = "/v1/chat/completions",
    **extra: Any,
) -> tuple[int, dict[str, Any]]:
    """POST a chat (or completions) request with ``x-session-id``; returns (status, json)."""
    headers = {"x-session-id": session} if session is not None else {}
    body: dict[str, Any] = (
        chat(**extra) if path != "/v1/completions" else {"model": "m", "prompt": "p", **extra}
    )
    async with client.post(router.url + path, json=body, headers=headers) as resp:
        return resp.status, await resp.json()
