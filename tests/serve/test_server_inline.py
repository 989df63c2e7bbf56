"""The proxy's callback-driven common case (``serve/inline.py``) and its hand-overs.

Each test first sends one request so that a pooled connection to the worker exists: only
then does a request go out from the listener's callbacks (without one, connecting waits and
the coroutine path does everything, which the other serve tests cover).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import aiohttp
import pytest

from sessionroute.serve.http1 import Connection

from .backend import FakeBackend
from .conftest import MakeRouter, chat, post_chat


async def test_answers_come_back_inline_on_a_pooled_connection(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    b = backends[0]
    router = await make_router([b.url])
    handed: list[object] = []
    hand_over = Connection.hand_over

    def counted(conn: Connection, coro: Coroutine[Any, Any, None]) -> None:
        handed.append(coro)
        hand_over(conn, coro)

    monkeypatch.setattr(Connection, "hand_over", counted)
    for i in range(5):
        status, body = await post_chat(client, router, f"s-{i % 2}")
        assert status == 200 and body["choices"]
    assert len(handed) == 1  # only the first, which had to connect: the others ran inline
    assert router.router.upstream.idle_count(b.url) == 1  # one connection, reused
    assert router.router.metrics.requests[(b.url, 200)] == 5
    assert router.router.core.cluster.in_flight(b.url) == 0


async def test_a_deadline_passing_inline_is_a_504_and_releases(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    router = await make_router([b.url], request_timeout_secs=0.3)
    assert (await post_chat(client, router, "t"))[0] == 200  # pools a connection
    b.hold = asyncio.Event()  # never set: no answer
    status, body = await post_chat(client, router, "t")
    assert status == 504 and body["error"]["code"] == "upstream_timeout"
    assert router.router.core.cluster.in_flight(b.url) == 0
    assert router.router.metrics.requests[(b.url, 504)] == 1
    assert router.router.upstream.idle_count(b.url) == 0  # the timed-out connection closed
    b.hold = None
    assert (await post_chat(client, router, "t"))[0] == 200  # a new connection serves


async def test_a_client_leaving_during_an_inline_exchange_releases_it(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    router = await make_router([b.url])
    core = router.router.core
    assert (await post_chat(client, router, "c"))[0] == 200
    b.hold = asyncio.Event()
    task = asyncio.create_task(
        client.post(router.url + "/v1/chat/completions", json=chat(), headers={"x-session-id": "c"})
    )
    for _ in range(200):
        if core.cluster.in_flight(b.url) == 1:
            break
        await asyncio.sleep(0.01)
    assert core.cluster.in_flight(b.url) == 1
    task.cancel()  # the client goes away before the answer
    for _ in range(200):
        if core.cluster.in_flight(b.url) == 0:
            break
        await asyncio.sleep(0.01)
    assert core.cluster.in_flight(b.url) == 0
    assert router.router.metrics.requests[(b.url, 499)] == 1
    b.hold.set()


async def test_retryable_statuses_are_handed_to_the_retry_loop(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    router = await make_router([b.url])
    assert (await post_chat(client, router, "r"))[0] == 200
    b.fail_statuses = [503, 503]  # answered on the pooled connection, then retried
    status, _ = await post_chat(client, router, "r")
    assert status == 200
    assert router.router.metrics.retries[b.url] == 2
    assert router.router.core.cluster.in_flight(b.url) == 0


async def test_a_streamed_answer_is_handed_to_the_relay(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    router = await make_router([b.url])
    assert (await post_chat(client, router, "st"))[0] == 200
    async with client.post(
        router.url + "/v1/chat/completions",
        json=chat(stream=True),
        headers={"x-session-id": "st"},
    ) as resp:
        text = await resp.text()
    assert resp.status == 200 and text.rstrip().endswith("data: [DONE]")
    assert router.router.core.cluster.in_flight(b.url) == 0
