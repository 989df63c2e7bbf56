"""Streaming relay: order, timing (events before the backend finishes), disconnects."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from .backend import FakeBackend
from .conftest import MakeRouter, chat

STREAM_BODY = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


async def _next_event(resp: aiohttp.ClientResponse) -> str:
    """The payload of the next ``data:`` line."""
    while True:
        line = await asyncio.wait_for(resp.content.readline(), 5)
        if not line:
            raise EOFError("stream ended")
        if line.startswith(b"data: "):
            return line[6:].strip().decode()


async def test_events_relayed_as_they_arrive_in_order(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    b.gates = {1: asyncio.Event(), 2: asyncio.Event()}
    router = await make_router([b.url])
    async with client.post(
        router.url + "/v1/chat/completions", json=STREAM_BODY, headers={"x-session-id": "st"}
    ) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["x-request-id"].startswith("chatcmpl-")
        first = json.loads(await _next_event(resp))
        # The first event reached the client while the backend is still held at gate 1.
        assert first["choices"][0]["delta"]["content"] == "tok0 "
        assert not b.stream_finished.is_set() and 1 not in b.sent
        assert router.router.core.cluster.in_flight(b.url) == 1
        b.gates[1].set()
        second = json.loads(await _next_event(resp))
        assert second["choices"][0]["delta"]["content"] == "tok1 "
        assert not b.stream_finished.is_set()
        b.gates[2].set()
        third = json.loads(await _next_event(resp))
        assert third["choices"][0]["delta"]["content"] == "tok2 "
        assert await _next_event(resp) == "[DONE]"
        assert await resp.content.read() == b"\n"  # the blank line ending the event
    assert router.router.core.cluster.in_flight(b.url) == 0


async def test_client_disconnect_cancels_upstream_and_releases_once(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    b.gates = {1: asyncio.Event()}  # never set: the backend would stream forever
    router = await make_router([b.url], policy="sticky_least_loaded")
    resp = await client.post(
        router.url + "/v1/chat/completions", json=STREAM_BODY, headers={"x-session-id": "dc"}
    )
    assert json.loads(await _next_event(resp))["choices"][0]["delta"]["content"] == "tok0 "
    assert router.router.core.cluster.in_flight(b.url) == 1
    resp.close()  # the client goes away mid-stream
    await asyncio.wait_for(b.stream_cancelled.wait(), 5)
    core = router.router.core
    assert core.cluster.in_flight(b.url) == 0
    assert core.policy.session_counts() == {b.url: 1}  # the session itself stays pinned
    metrics = router.router.metrics.render().decode()
    assert f'sessionroute_requests_total{{status="499",worker="{b.url}"}} 1.0' in metrics
    # The router keeps serving.
    async with client.post(
        router.url + "/v1/chat/completions", json=chat(), headers={"x-session-id": "dc"}
    ) as r:
        assert r.status == 200


async def test_backend_killed_mid_stream_truncates_and_releases(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    b.gates = {1: asyncio.Event()}
    router = await make_router([b.url], policy="consistent_hash")
    resp = await client.post(
        router.url + "/v1/chat/completions", json=STREAM_BODY, headers={"x-session-id": "k"}
    )
    await _next_event(resp)
    await b.kill()
    try:
        rest = await asyncio.wait_for(resp.content.read(), 5)
    except aiohttp.ClientPayloadError:
        rest = b"<truncated>"
    finally:
        resp.close()
    assert b"[DONE]" not in rest  # never a clean end for a broken stream
    assert router.router.core.cluster.in_flight(b.url) == 0
