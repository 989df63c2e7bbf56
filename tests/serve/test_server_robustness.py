"""Exactly-once release on every path, and hostile input never breaks the router."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from .backend import FakeBackend
from .conftest import JSON, MakeRouter, chat, post_chat

STREAM = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}


async def test_every_path_releases_exactly_once(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    """One stream stays in flight throughout; a double release would drop the count to 0."""
    b = backends[0]
    b.gates = {1: asyncio.Event()}
    router = await make_router([b.url], policy="sticky_least_loaded", max_payload_size=4096)
    core = router.router.core
    anchor = await client.post(
        router.url + "/v1/chat/completions", json=STREAM, headers={"x-session-id": "anchor"}
    )
    await anchor.content.readline()
    assert core.cluster.in_flight(b.url) == 1
    b.gates = {}
    b.fail_statuses = [503, 503]  # retried, then 200
    assert (await post_chat(client, router, "p1"))[0] == 200
    b.fail_statuses = [400]  # passed through
    assert (await post_chat(client, router, "p2"))[0] == 400
    async with client.post(router.url + "/v1/completions", data=b"x" * 5000, headers=JSON) as r:
        assert r.status == 413
    async with client.post(router.url + "/v1/chat/completions", data=b"{bad", headers=JSON) as r:
        assert r.status == 400  # rejected before placement: nothing reserved
    b.gates = {1: asyncio.Event()}
    gone = await client.post(
        router.url + "/v1/chat/completions", json=STREAM, headers={"x-session-id": "p4"}
    )
    await gone.content.readline()
    assert core.cluster.in_flight(b.url) == 2
    b.stream_cancelled.clear()
    gone.close()
    await asyncio.wait_for(b.stream_cancelled.wait(), 5)
    assert core.cluster.in_flight(b.url) == 1  # only the anchor is left
    anchor.close()


async def test_hostile_input_never_breaks_the_router(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends], policy="sticky_least_loaded")
    odd_ids = ["", " ", "x" * 4000, "a%20b", "ü", "../../etc", "\t", "a,b", '"q"']
    for sid in odd_ids:
        async with client.post(
            router.url + "/v1/chat/completions",
            data=json.dumps(chat()).encode("latin-1"),
            headers={**JSON, "x-session-id": sid.encode().decode("latin-1")},
        ) as r:
            assert r.status == (400 if len(sid) > 256 else 200), sid
        async with client.post(router.url + "/finish_session", params={"session_id": sid}) as r:
            assert r.status == 200
    for body in (b"", b"\x00" * 100, b"[]", b"null", b'{"stream": "yes"}', b"{" * 1000):
        async with client.post(router.url + "/v1/chat/completions", data=body, headers=JSON) as r:
            assert r.status == 400
    for query in ("session_id", "session_id=%ZZ", "session_id=a&session_id=b", "x=1"):
        async with client.post(router.url + "/finish_session?" + query) as r:
            assert r.status in (200, 400), query
    # Raw garbage on the socket gets an HTTP error, and the router keeps serving.
    host, port = "127.0.0.1", router.port
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    await writer.drain()
    first = await asyncio.wait_for(reader.readline(), 5)
    assert first.split()[1] == b"400"
    writer.close()
    await writer.wait_closed()
    assert (await post_chat(client, router, "after"))[0] == 200
    core = router.router.core
    assert all(core.cluster.in_flight(b.url) == 0 for b in backends)
    assert core.policy.worker_of("after") is not None
