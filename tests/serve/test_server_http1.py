"""The router's own HTTP/1.1 listener, driven over raw sockets: keep-alive, pipelining,
HTTP/1.0, chunked bodies, Expect, HEAD, malformed input, early answers and backpressure."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web

from sessionroute.types import DecisionKind

from .backend import FakeBackend
from .conftest import MakeRouter

if TYPE_CHECKING:
    from sessionroute.serve.listener import Listener

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, limit=2**24)


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response (Content-Length, chunked or close-delimited body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ln)}
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = await asyncio.wait_for(reader.read(), 5)
    return status, headers, body


def _post(path: str = "/v1/chat/completions", body: bytes = BODY, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: r\r\nx-session-id: s\r\n"
        f"Content-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def test_keep_alive_and_pipelined_requests_answer_in_order(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    router = await make_router([backends[0].url])
    reader, writer = await _connect(router.port)
    writer.write(_post() + b"GET /liveness HTTP/1.1\r\nHost: r\r\n\r\n" + _post("/nope"))
    first, second, third = [await _response(reader) for _ in range(3)]
    assert first[0] == 200 and json.loads(first[2])["object"] == "chat.completion"
    assert "connection" not in first[1] and "date" in first[1]
    assert second[0] == 200 and json.loads(second[2]) == {"status": "alive"}
    assert third[0] == 404 and json.loads(third[2])["error"]["code"] == "not_found"
    writer.write(b"HEAD /liveness HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
    head = await asyncio.wait_for(reader.read(), 5)  # the router closes after it
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    assert b"Connection: close\r\n" in head and b"Content-Length: 19\r\n" in head
    writer.close()
    assert router.router.core.cluster.in_flight(backends[0].url) == 0


async def test_http10_clients(backends: list[FakeBackend], make_router: MakeRouter) -> None:
    router = await make_router([backends[0].url])
    reader, writer = await _connect(router.port)
    req = _post(body=BODY).replace(b"HTTP/1.1", b"HTTP/1.0")
    writer.write(req.replace(b"Host: r\r\n", b"Host: r\r\nConnection: keep-alive\r\n"))
    status, headers, _ = await _response(reader)
    assert status == 200 and headers["connection"] == "keep-alive"
    writer.write(req)  # without keep-alive: closed after the answer
    status, headers, _ = await _response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 5) == b""
    # A stream to an HTTP/1.0 client is delimited by the close (no chunked encoding).
    reader, writer = await _connect(router.port)
    stream = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user"}]}).encode()
    writer.write(_post(body=stream).replace(b"HTTP/1.1", b"HTTP/1.0"))
    status, headers, body = await _response(reader)
    assert status == 200 and "transfer-encoding" not in headers
    assert body.count(b"data: ") == 4 and body.endswith(b"data: [DONE]\n\n")


async def test_chunked_request_body_and_expect_continue(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    b = backends[0]
    router = await make_router([b.url])
    reader, writer = await _connect(router.port)
    half = len(BODY) // 2
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\nExpect: 100-continue\r\n\r\n"
    )
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == (
        b"HTTP/1.1 100 Continue\r\n\r\n"
    )
    for piece in (BODY[:half], BODY[half:]):
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
    writer.write(b"0\r\n\r\n")
    status, _, _ = await _response(reader)
    assert status == 200
    assert b.seen[-1].body == BODY
    assert b.seen[-1].headers["Content-Length"] == str(len(BODY))
    assert "Transfer-Encoding" not in b.seen[-1].headers and "Expect" not in b.seen[-1].headers
    writer.write(_post(extra="Expect: magic\r\n"))
    status, _, body = await _response(reader)
    assert status == 417 and json.loads(body)["error"]["code"] == "expectation_failed"
    writer.close()


async def test_trailer_fields_are_not_looked_up_as_headers(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    router = await make_router([backends[0].url])  # sticky_least_loaded: keeps sessions
    reader, writer = await _connect(router.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\n%x\r\n%s\r\n0\r\n"
        b"x-session-id: from-a-trailer\r\n\r\n" % (len(BODY), BODY)
    )
    status, _, _ = await _response(reader)
    assert status == 200
    decisions = router.router.core.decisions
    assert decisions[DecisionKind.STATELESS] == 1 and decisions[DecisionKind.NEW] == 0
    writer.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: r\r\nBad Header\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: x\r\n\r\n",
    ],
)
async def test_malformed_requests_get_400_and_a_close(
    garbage: bytes, backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    router = await make_router([backends[0].url])
    reader, writer = await _connect(router.port)
    writer.write(garbage)
    status, headers, body = await _response(reader)
    assert status == 400 and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "bad_request"
    assert await asyncio.wait_for(reader.read(), 5) == b""
    reader, writer = await _connect(router.port)  # the router keeps serving
    writer.write(_post())
    assert (await _response(reader))[0] == 200
    writer.close()


async def test_early_413_is_read_before_the_close(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    router = await make_router([backends[0].url], max_payload_size=1000)
    reader, writer = await _connect(router.port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\n"
    )
    writer.write(b"%x\r\n%s\r\n" % (1500, b"x" * 1500))  # over the limit, body not ended
    status, headers, body = await _response(reader)
    assert status == 413 and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "payload_too_large"
    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (10, b"y" * 10))  # the rest is read and dropped
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert backends[0].seen == []


@pytest.fixture
async def firehose() -> AsyncIterator[tuple[str, dict[str, int]]]:
    """A backend streaming 48 MiB; ``state["sent"]`` counts the bytes it has written."""
    state = {"sent": 0}
    chunk = b"z" * 65536

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        for _ in range(768):
            await resp.write(chunk)
            state["sent"] += len(chunk)
        await resp.write_eof()
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")  # a worker counts healthy once a check passed

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", state
    await runner.cleanup()


async def test_backpressure_stops_reading_upstream(
    firehose: tuple[str, dict[str, int]], make_router: MakeRouter
) -> None:
    url, state = firehose
    total = 768 * 65536
    router = await make_router([url])
    reader, writer = await _connect(router.port)
    writer.write(_post("/v1/completions", b'{"prompt": "p"}'))
    # Without reading, wait until the backend stops making progress (or finishes).
    last, still = -1, 0
    while state["sent"] < total and still < 50:
        still = still + 1 if state["sent"] == last else 0
        last = state["sent"]
        await asyncio.sleep(0.01)
    assert state["sent"] < total  # the router stopped reading upstream: the backend is blocked
    (conn,) = router.listener.connections
    assert conn.transport is not None
    assert conn.transport.get_write_buffer_size() < 2**20  # the router buffers little
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert b"Transfer-Encoding: chunked" in head
    got = 0
    while True:
        size = int((await asyncio.wait_for(reader.readline(), 5)).strip(), 16)
        await reader.readexactly(size + 2)
        if size == 0:
            break
        got += size
    assert got == total == state["sent"]
    writer.close()


async def test_upgrade_requests_are_served_then_closed(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    router = await make_router([backends[0].url])
    reader, writer = await _connect(router.port)
    writer.write(
        b"GET /liveness HTTP/1.1\r\nHost: r\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # what follows belongs to the other protocol
    )
    status, _, body = await _response(reader)
    assert status == 200 and json.loads(body) == {"status": "alive"}
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_connection_serves_on_after_an_upstream_timeout(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    """The connection's task absorbs a timeout's cancellation and serves the next request."""
    b = backends[0]
    b.hold = asyncio.Event()  # held until released below
    router = await make_router([b.url], request_timeout_secs=0.2)
    reader, writer = await _connect(router.port)
    writer.write(_post())
    status, _, body = await _response(reader)
    assert status == 504 and json.loads(body)["error"]["code"] == "upstream_timeout"
    b.hold.set()
    writer.write(_post())  # same connection
    status, _, body = await _response(reader)
    assert status == 200 and json.loads(body)["object"] == "chat.completion"
    (conn,) = router.listener.connections
    assert conn.task is not None and not conn.task.done() and conn.task.cancelling() == 0
    writer.close()
    assert router.router.core.cluster.in_flight(b.url) == 0


async def test_a_client_stalled_mid_body_is_disconnected_and_a_slow_one_is_not() -> None:
    from sessionroute.serve.http1 import Connection, Request
    from sessionroute.serve.listener import Listener
    from sessionroute.serve.wire import json_response

    cancelled: list[bool] = []

    async def handle(conn: Connection, req: Request) -> None:
        try:
            parts = await req.body()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        conn.respond(json_response({"bytes": sum(map(len, parts or []))}))

    listener = Listener(handle, max_body=1 << 20, keepalive_s=1.0)  # sweeps every 0.5 s
    port = await listener.start("127.0.0.1", 0)
    try:
        head = b"POST /x HTTP/1.1\r\nHost: r\r\nContent-Length: 30\r\n\r\n"
        stalled_r, stalled_w = await _connect(port)
        stalled_w.write(head + b"0123456789")  # 10 of 30 body bytes, then nothing
        slow_r, slow_w = await _connect(port)
        slow_w.write(head)
        for _ in range(30):  # one byte every 50 ms: 1.5 s in all, three sweeps
            await asyncio.sleep(0.05)
            slow_w.write(b"x")
        status, _, body = await _response(slow_r)
        assert status == 200 and json.loads(body) == {"bytes": 30}
        assert await asyncio.wait_for(stalled_r.read(), 5) == b""  # disconnected
        assert cancelled == [True]
        # an idle keep-alive connection is closed too
        assert await asyncio.wait_for(slow_r.read(), 5) == b""
        for w in (stalled_w, slow_w):
            w.close()
    finally:
        await listener.shutdown(1.0)


async def _target_echo_listener() -> tuple[Listener, int]:
    """A listener answering each request with its target, path and query (JSON), and its port."""
    from sessionroute.serve.http1 import Connection, Request
    from sessionroute.serve.listener import Listener
    from sessionroute.serve.wire import json_response

    def handle(conn: Connection, req: Request) -> None:
        conn.respond(json_response([req.target.decode(), req.path, req.query]))

    listener = Listener(handle, max_body=1 << 20)
    return listener, await listener.start("127.0.0.1", 0)


async def test_request_targets_are_parsed_once_and_their_memo_is_bounded() -> None:
    """Each target's path and query are parsed once and remembered (origin- and absolute-form,
    fragments left out); a target past the memo's bound, or too long to be remembered, is
    parsed as well, and an invalid absolute-form one is a 400."""
    from sessionroute.serve.listener import TARGET_KEPT_BYTES, TARGETS_KEPT

    listener, port = await _target_echo_listener()
    try:
        reader, writer = await _connect(port)

        async def get(target: str) -> tuple[int, Any]:
            writer.write(f"GET {target} HTTP/1.1\r\nHost: r\r\n\r\n".encode())
            status, _, body = await _response(reader)
            return status, json.loads(body)

        for _ in range(2):  # parsed, then remembered
            assert await get("/a%20b?x=1#f") == (200, ["/a%20b?x=1#f", "/a%20b", "x=1"])
            assert await get("http://h:1/p?q") == (200, ["/p?q", "/p", "q"])
            assert await get("http://h") == (200, ["/", "/", ""])
        assert listener.targets[b"/a%20b?x=1#f"] == (b"/a%20b?x=1#f", "/a%20b", "x=1")
        writer.write(b"".join(b"GET /t%d HTTP/1.1\r\n\r\n" % i for i in range(TARGETS_KEPT)))
        for i in range(TARGETS_KEPT):
            status, _, body = await _response(reader)
            assert (status, json.loads(body)) == (200, [f"/t{i}", f"/t{i}", ""])
        assert 0 < len(listener.targets) <= TARGETS_KEPT  # emptied when full
        assert await get("/past?the=bound") == (200, ["/past?the=bound", "/past", "the=bound"])
        assert listener.targets[b"/past?the=bound"] == (b"/past?the=bound", "/past", "the=bound")
        long = "/" + "l" * TARGET_KEPT_BYTES
        assert await get(long + "?q") == (200, [long + "?q", long, "q"])
        assert long.encode() + b"?q" not in listener.targets
        status, error = await get("http://h:bad/p")
        assert status == 400 and error["error"]["code"] == "bad_request"
        assert b"http://h:bad/p" not in listener.targets
        writer.close()
    finally:
        await listener.shutdown(1.0)


async def test_a_target_split_across_reads_is_joined_and_not_carried_over() -> None:
    """A request target that arrives in several reads is whole in the request, and the next
    requests on the connection (one read, pipelined) each get their own target only."""
    listener, port = await _target_echo_listener()
    try:
        reader, writer = await _connect(port)
        for piece in (b"GET /sp", b"lit/ta", b"rget?q=", b"1 HTTP/1.1\r\nHost: r\r\n\r\n"):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.05)  # each its own read
        status, _, body = await _response(reader)
        assert (status, json.loads(body)) == (200, ["/split/target?q=1", "/split/target", "q=1"])
        writer.write(b"GET /a HTTP/1.1\r\nHost: r\r\n\r\nGET /b?c HTTP/1.1\r\nHost: r\r\n\r\n")
        for expected in (["/a", "/a", ""], ["/b?c", "/b", "c"]):
            status, _, body = await _response(reader)
            assert (status, json.loads(body)) == (200, expected)
        writer.close()
    finally:
        await listener.shutdown(1.0)


def test_head_starts_follow_the_clock_with_the_standard_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The status line carries the standard reason ('Unknown' for a non-standard status) and
    the Date line changes with the second."""
    import time

    from sessionroute.serve import wire

    now = [1_700_000_000.2]
    monkeypatch.setattr(time, "time", lambda: now[0])
    heads = wire.HeadCache()
    assert heads.start(200) == b"HTTP/1.1 200 OK\r\nDate: Tue, 14 Nov 2023 22:13:20 GMT\r\n"
    now[0] += 0.7
    assert heads.start(404) == (
        b"HTTP/1.1 404 Not Found\r\nDate: Tue, 14 Nov 2023 22:13:20 GMT\r\n"
    )
    now[0] += 0.2
    assert heads.start(200) == b"HTTP/1.1 200 OK\r\nDate: Tue, 14 Nov 2023 22:13:21 GMT\r\n"
    assert heads.start(599) == b"HTTP/1.1 599 Unknown\r\nDate: Tue, 14 Nov 2023 22:13:21 GMT\r\n"
