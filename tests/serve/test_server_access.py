"""Auth and admin access, session lookup, and connection limits (issue 19, items 3, 5, 6)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from sessionroute.serve.listener import Listener

from .backend import FakeBackend
from .conftest import MakeRouter, chat, post_chat
from .test_server_http1 import _connect, _response


async def test_the_bearer_scheme_is_case_insensitive(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([backends[0].url], router_api_key="k3y")
    for auth, status in (
        ("Bearer k3y", 200),
        ("bearer k3y", 200),
        ("BEARER  k3y", 200),
        ("Basic k3y", 401),
        ("bearer k3", 401),
        ("k3y", 401),
    ):
        async with client.post(
            router.url + "/v1/chat/completions", json=chat(), headers={"Authorization": auth}
        ) as r:
            assert r.status == status, auth


async def test_health_details_and_admin_routes_need_the_key(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends[:2]], router_api_key="k3y")
    router.router.core.set_health(backends[1].url, False)
    async with client.get(router.url + "/health") as r:
        assert r.status == 503 and await r.json() == {"status": "unhealthy"}  # no URLs
    key = {"Authorization": "bearer k3y"}
    async with client.get(router.url + "/health", headers=key) as r:
        assert (await r.json())["unhealthy_workers"] == [backends[1].url]
    for path in ("/add_worker?url=http://evil:1", "/remove_worker?url=" + backends[0].url):
        async with client.post(router.url + path) as r:
            assert r.status == 401, path
    assert len(router.router.core.cluster.workers()) == 2


async def test_without_a_key_admin_routes_answer_loopback_only(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([backends[0].url])
    app = router.listener.handler
    # a remote client, as the connection reports it
    reader, writer = await _connect(router.port)
    (conn,) = router.listener.connections
    conn.peer_is_loopback = lambda: False  # type: ignore[method-assign]
    writer.write(b"POST /add_worker?url=http://10.0.0.1:1 HTTP/1.1\r\nHost: r\r\n\r\n")
    status, _, body = await _response(reader)
    assert status == 403 and json.loads(body)["error"]["code"] == "admin_forbidden"
    writer.write(b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n")
    status, _, body = await _response(reader)
    assert status == 200 and json.loads(body) == {"status": "healthy"}
    writer.close()
    assert app is not None
    # loopback clients (this test) may use them
    async with client.post(router.url + "/remove_worker?url=" + backends[0].url) as r:
        assert r.status == 200
    opened = await make_router([backends[0].url], allow_remote_admin=True)
    reader, writer = await _connect(opened.port)
    (conn,) = opened.listener.connections
    conn.peer_is_loopback = lambda: False  # type: ignore[method-assign]
    writer.write(b"POST /remove_worker?url=" + backends[0].url.encode() + b" HTTP/1.1\r\n\r\n")
    assert (await _response(reader))[0] == 200
    writer.close()


async def test_session_lookup_and_worker_header(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    clock_router = await make_router(
        [b.url for b in backends], policy="sticky_least_loaded", expose_worker_header=True
    )
    clock = clock_router.router.clock
    workers = []
    for _ in range(3):
        async with client.post(
            clock_router.url + "/v1/chat/completions",
            json=chat(),
            headers={"x-session-id": "look me/up"},
        ) as r:
            assert r.status == 200
            workers.append(r.headers["x-sessionroute-worker"])
        clock.advance(2.0)  # type: ignore[attr-defined]
    assert len(set(workers)) == 1
    async with client.get(clock_router.url + "/sessions/look%20me%2Fup") as r:
        assert r.status == 200
        info = await r.json()
    assert info["worker"] == workers[0] and info["turns"] == 3
    assert info["age_s"] == 6.0 and info["idle_s"] == 2.0 and info["worker_available"]
    async with client.get(clock_router.url + "/sessions/nobody") as r:
        assert r.status == 404 and (await r.json())["error"]["code"] == "session_not_found"
    plain = await make_router([backends[0].url], policy="consistent_hash")
    async with client.post(plain.url + "/v1/chat/completions", json=chat()) as r:
        assert "x-sessionroute-worker" not in r.headers  # off by default
    async with client.get(plain.url + "/sessions/x") as r:
        assert r.status == 404 and "keeps no session table" in (await r.json())["error"]["message"]


async def test_connection_cap_and_slow_clients_are_closed_and_counted() -> None:
    from sessionroute.serve.http1 import Connection, Request
    from sessionroute.serve.wire import json_response

    closed: list[str] = []

    def handle(conn: Connection, req: Request) -> None:
        conn.respond(json_response({"ok": True}))

    listener = Listener(
        handle,
        max_body=1 << 20,
        # limits long enough that the first four connections are all open at once on a
        # loaded machine (a header timeout firing before the fourth connects frees a slot)
        keepalive_s=2.0,
        header_timeout_s=1.5,
        max_connections=3,
        on_closed=closed.append,
    )
    port = await listener.start("127.0.0.1", 0)
    try:
        slowloris = await _connect(port)  # a head, one byte at a time, never ending
        silent = await _connect(port)  # connects and sends nothing
        idle = await _connect(port)
        idle[1].write(b"GET / HTTP/1.1\r\nHost: r\r\n\r\n")
        assert (await _response(idle[0]))[0] == 200
        over = await _connect(port)  # the fourth: closed at once
        assert await asyncio.wait_for(over[0].read(), 5) == b""
        assert closed == ["connection_limit"]
        slowloris[1].write(b"GET / HTTP/1.1\r\n")
        for _ in range(80):  # up to 4 s of trickle, past the 1.5 s head limit
            await asyncio.sleep(0.05)
            if slowloris[0].at_eof() or slowloris[1].is_closing():
                break
            slowloris[1].write(b"X")
        for reader, _ in (slowloris, silent, idle):
            await asyncio.wait_for(reader.read(), 5)  # each is closed in time
        assert sorted(closed) == [
            "connection_limit",
            "header_timeout",
            "header_timeout",
            "idle_timeout",
        ]
        ok = await _connect(port)  # the router keeps serving
        ok[1].write(b"GET / HTTP/1.1\r\nHost: r\r\n\r\n")
        assert (await _response(ok[0]))[0] == 200
        for _, w in (slowloris, silent, idle, over, ok):
            w.close()
    finally:
        await listener.shutdown(1.0)


async def test_serve_metrics_count_closed_connections(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([backends[0].url], max_connections=1)
    _, writer = await _connect(router.port)
    with pytest.raises(aiohttp.ClientError):  # a second connection: closed at once
        await post_chat(client, router, "m")
    writer.close()
    assert router.router.metrics.client_closed == {"connection_limit": 1}
