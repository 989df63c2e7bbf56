"""The upstream path: keep-alive pool, response framings, raw header forwarding, timeouts.

A small raw HTTP/1.1 server (asyncio streams on 127.0.0.1) plays the worker where a test needs
exact control of the bytes on the wire: chunked and read-until-close responses, informational
responses, connections closed by the worker, and the request bytes the router sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest

from sessionroute.serve.exchange import Exchange
from sessionroute.serve.upstream import UpstreamConnectError, UpstreamError, UpstreamPool

from .backend import FakeBackend
from .conftest import MakeRouter, chat, post_chat

OK_BODY = b'{"object": "chat.completion", "choices": []}'


def fixed(body: bytes = OK_BODY, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


@dataclass
class RawBackend:
    """A raw HTTP/1.1 worker: records each request's head and body, answers ``respond``.

    ``respond`` returns the response bytes (or a list of pieces, written one after the other
    ``pause_s`` apart) and whether to close the connection after them.
    """

    respond: Callable[[bytes], tuple[bytes | list[bytes], bool]] = lambda head: (fixed(), False)
    pause_s: float = 0.002
    heads: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    connections: int = 0
    server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        if self.server is None:
            raise RuntimeError("not started")
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def start(self) -> RawBackend:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                if head.startswith(b"GET "):  # health checks
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    continue
                self.heads.append(head)
                self.bodies.append(body)
                data, close = self.respond(head)
                for i, piece in enumerate([data] if isinstance(data, bytes) else data):
                    if i:
                        await asyncio.sleep(self.pause_s)
                    writer.write(piece)
                    await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def raw() -> AsyncIterator[RawBackend]:
    backend = await RawBackend().start()
    yield backend
    await backend.stop()


def header_lines(head: bytes) -> list[bytes]:
    return head.split(b"\r\n")[1:-2]


async def test_connections_are_reused(raw: RawBackend, make_router: MakeRouter) -> None:
    router = await make_router([raw.url])
    async with aiohttp.ClientSession() as client:
        for i in range(5):
            assert (await post_chat(client, router, f"s{i}"))[0] == 200
    assert len(raw.heads) == 5
    assert raw.connections == 2  # the startup health check's session, then one for all 5
    assert router.router.upstream.idle_count(raw.url) == 1


@pytest.mark.parametrize("how", ["connection-close", "silent-close"])
async def test_connection_closed_by_the_worker_is_not_reused(
    how: str, raw: RawBackend, make_router: MakeRouter
) -> None:
    extra = b"Connection: close\r\n" if how == "connection-close" else b""
    raw.respond = lambda head: (fixed(extra=extra), True)
    router = await make_router([raw.url], disable_retries=True)
    async with aiohttp.ClientSession() as client:
        for i in range(3):
            assert (await post_chat(client, router, f"c{i}"))[0] == 200
            await asyncio.sleep(0)  # the router sees the close before the next request
            for _ in range(50):
                if router.router.upstream.idle_count(raw.url) == 0:
                    break
                await asyncio.sleep(0.01)
    assert len(raw.heads) == 3
    assert router.router.workers[raw.url].breaker.state == 0  # no failure was recorded


async def test_response_framings_are_relayed(raw: RawBackend, make_router: MakeRouter) -> None:
    responses = {
        b"/v1/chat/completions": (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            b"7\r\ndata: 1\r\n7\r\ndata: 2\r\n0\r\n\r\n",
            False,
        ),
        b"/v1/completions": (  # neither length nor chunked: the body ends with the connection
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
            + OK_BODY,
            True,
        ),
        b"/v1/embeddings": (  # an informational response first
            b"HTTP/1.1 100 Continue\r\n\r\n" + fixed(b'{"data": []}'),
            False,
        ),
    }
    raw.respond = lambda head: responses[head.split(b" ")[1]]
    router = await make_router([raw.url])
    async with aiohttp.ClientSession() as client:
        async with client.post(router.url + "/v1/chat/completions", json=chat()) as r:
            assert r.status == 200 and await r.read() == b"data: 1data: 2"
        async with client.post(router.url + "/v1/completions", json={"prompt": "p"}) as r:
            assert r.status == 200 and await r.read() == OK_BODY
        async with client.post(router.url + "/v1/embeddings", json={"input": "i"}) as r:
            assert r.status == 200 and await r.json() == {"data": []}
    assert router.router.core.cluster.in_flight(raw.url) == 0


@pytest.mark.parametrize(
    ("status_line", "expected"),
    [
        (b"HTTP/1.1 200 Fine", (200, "OK")),
        (b"HTTP/1.1 404 Gone \xffaway", (404, "Not Found")),
        (b"HTTP/1.1 201 ", (201, "Created")),
        (b"HTTP/1.1 599 Custom", (599, "Unknown")),  # no canonical phrase
    ],
)
@pytest.mark.parametrize("chunked", [False, True])
async def test_the_canonical_reason_phrase_is_relayed_not_the_workers(
    status_line: bytes,
    expected: tuple[int, str],
    chunked: bool,
    raw: RawBackend,
    make_router: MakeRouter,
) -> None:
    """As vllm-router: the client gets the status's standard phrase whatever the worker
    wrote, both for an answer relayed in one write and for one streamed (chunked), on a new
    connection (the coroutine) and on a kept-alive one (callbacks first)."""
    framing = (
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(OK_BODY), OK_BODY)
        if chunked
        else b"Content-Length: %d\r\n\r\n%s" % (len(OK_BODY), OK_BODY)
    )
    raw.respond = lambda head: (
        status_line + b"\r\nContent-Type: application/json\r\n" + framing,
        False,
    )
    router = await make_router([raw.url], disable_retries=True)
    async with aiohttp.ClientSession() as client:
        for _ in range(2):
            async with client.post(router.url + "/v1/chat/completions", json=chat()) as r:
                assert (r.status, r.reason) == expected
                assert await r.read() == OK_BODY
    assert len(raw.heads) == 2 and raw.connections == 2  # (a health check's, then one)


async def _raw_request(port: int, request: bytes, *, expect_continue: bool = False) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if expect_continue:
            head, body = request.split(b"\r\n\r\n", 1)
            writer.write(head + b"\r\n\r\n")
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert interim.startswith(b"HTTP/1.1 100 Continue")
            writer.write(body)
        else:
            writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return head + await reader.readexactly(length)
    finally:
        writer.close()


async def test_response_header_names_of_any_case_and_number_are_relayed_or_dropped(
    raw: RawBackend, make_router: MakeRouter
) -> None:
    """Every response header is relayed in order or dropped by its name in any spelling,
    however many names a worker sends."""
    names = [b"X-Unique-%d" % i for i in range(300)]
    head = b"".join(b"%s: v%d\r\n" % (n, i) for i, n in enumerate(names))
    raw.respond = lambda _: (
        b"HTTP/1.1 200 OK\r\nSERVER: w\r\nSet-Cookie: a=1\r\n"
        + head
        + b"set-cookie: b=2\r\ncOnTeNt-LeNgTh: %d\r\nDate: x\r\n\r\n" % len(OK_BODY)
        + OK_BODY,
        False,
    )
    router = await make_router([raw.url])
    body = json.dumps(chat()).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    for _ in range(2):  # (the second on the kept-alive connection)
        answer = await _raw_request(router.port, request)
        assert answer.endswith(OK_BODY)
        lines = header_lines(answer.split(b"\r\n\r\n")[0] + b"\r\n\r\n")
        relayed = [line for line in lines if line.startswith((b"X-Unique-", b"Set-", b"set-"))]
        assert relayed == [b"Set-Cookie: a=1"] + [
            b"%s: v%d" % (n, i) for i, n in enumerate(names)
        ] + [b"set-cookie: b=2"]
        lower = [line.lower() for line in lines]
        assert b"server: w" not in lower and b"date: x" not in lower
        assert lower.count(b"content-length: %d" % len(OK_BODY)) == 1


async def test_request_headers_go_upstream_as_raw_bytes(
    raw: RawBackend, make_router: MakeRouter
) -> None:
    router = await make_router([raw.url], api_key="worker-key")
    body = json.dumps(chat()).encode()
    request = (
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: router\r\n"
        b"Content-Type: application/json\r\n"
        b"Connection: keep-alive, X-Hop\r\nX-Hop: gone\r\nX-Raw: caf\xe9 \xff\r\n"
        b"x-SESSION-id: raw-1\r\nAuthorization: Bearer client\r\nTE: trailers\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    answer = await _raw_request(router.port, request)
    assert answer.startswith(b"HTTP/1.1 200 OK")
    assert raw.bodies == [body]
    head = raw.heads[0]
    assert head.startswith(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\n")
    lines = header_lines(head)
    assert lines[0] == b"Host: " + raw.url.removeprefix("http://").encode()
    assert b"X-Raw: caf\xe9 \xff" in lines  # bytes as received, name case kept
    assert b"x-SESSION-id: raw-1" in lines
    assert b"Authorization: Bearer worker-key" in lines
    assert b"Content-Length: %d" % len(body) in lines
    names = [line.split(b":")[0].lower() for line in lines]
    for dropped in (b"connection", b"x-hop", b"te"):
        assert dropped not in names
    assert names.count(b"authorization") == 1
    assert router.router.core.policy.worker_of("raw-1") == raw.url  # the header, any case


async def test_expect_100_continue(raw: RawBackend, make_router: MakeRouter) -> None:
    router = await make_router([raw.url])
    body = json.dumps(chat()).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nExpect: 100-continue\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    answer = await _raw_request(router.port, request, expect_continue=True)
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(OK_BODY)
    assert raw.bodies == [body]
    assert b"expect" not in raw.heads[0].lower()  # the router answered it


async def test_head_on_get_routes_and_json_405(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    router = await make_router([backends[0].url])
    async with aiohttp.ClientSession() as client:
        async with client.head(router.url + "/health") as r:
            assert r.status == 200 and await r.read() == b""
        async with client.delete(router.url + "/health") as r:
            assert r.status == 405
            assert r.headers["Allow"] == "GET, HEAD"
            assert (await r.json())["error"]["code"] == "method_not_allowed"
        async with client.get(router.url + "/v1/chat/completions") as r:
            assert r.status == 405 and r.headers["Allow"] == "POST"


async def test_timeout_mid_stream_truncates_and_releases(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    b = backends[0]
    b.gates = {1: asyncio.Event()}  # never set
    router = await make_router([b.url], request_timeout_secs=0.3)
    body = chat(stream=True)
    async with (
        aiohttp.ClientSession() as client,
        client.post(router.url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200
        first = await asyncio.wait_for(r.content.readline(), 5)
        assert first.startswith(b"data: ")
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(r.content.read(), 5)
    await asyncio.wait_for(b.stream_cancelled.wait(), 5)  # the worker saw the close
    assert router.router.core.cluster.in_flight(b.url) == 0
    assert f'sessionroute_requests_total{{status="502",worker="{b.url}"}} 1.0' in (
        router.router.metrics.render().decode()
    )


async def test_removed_worker_and_stop_close_idle_connections(
    raw: RawBackend, make_router: MakeRouter
) -> None:
    other = await RawBackend().start()
    try:
        router = await make_router([raw.url, other.url], policy="least_loaded")
        async with aiohttp.ClientSession() as client:
            for _ in range(4):
                await post_chat(client, router, None)
        pool = router.router.upstream
        assert pool.idle_count(raw.url) == 1 and pool.idle_count(other.url) == 1
        router.router.remove_worker(raw.url)
        assert pool.idle_count(raw.url) == 0
        await router.stop()
        assert pool.idle_count(other.url) == 0
    finally:
        await other.stop()


async def test_pool_prune_watchdog_and_connect_errors(raw: RawBackend) -> None:
    pool = UpstreamPool(timeout_s=0.2, connect_timeout_s=1.0, keepalive_s=0.0)
    pool.start()
    task = asyncio.current_task()
    assert task is not None
    try:
        ex = Exchange(pool, raw.url, task)
        try:
            head = pool.request_head(raw.url, "POST", b"/v1/completions")
            status = await ex.send((head + b"Content-Length: 2\r\n\r\n", b"{}"))
            assert status == 200
            assert await ex.read() == OK_BODY
        finally:
            ex.close()
        assert pool.idle_count(raw.url) == 1
        assert pool.prune() == 1  # past its (zero) keep-alive
        assert pool.idle_count(raw.url) == 0
        # The watchdog cancels the owning task once the deadline passes.
        raw.respond = lambda head: (b"", False)  # never answers
        ex = Exchange(pool, raw.url, task)
        try:
            with pytest.raises(asyncio.CancelledError):
                await ex.send((pool.request_head(raw.url, "POST", b"/x") + b"\r\n", b""))
            assert ex.is_timeout()  # only the timeout: the task goes on
        finally:
            ex.close()
        assert task.cancelling() == 0
        refused = Exchange(pool, "http://127.0.0.1:1", task)
        try:
            with pytest.raises(UpstreamConnectError):
                await refused.send((b"",))
        finally:
            refused.close()
        with pytest.raises(UpstreamConnectError):
            pool.request_head("ftp://x", "POST", b"/")
    finally:
        await pool.close()


async def test_many_concurrent_requests_share_the_pool(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    router = await make_router([backends[0].url])
    async with aiohttp.ClientSession() as client:
        results = await asyncio.gather(*(post_chat(client, router, f"m{i}") for i in range(40)))
    assert all(status == 200 and body["object"] == "chat.completion" for status, body in results)
    pool = router.router.upstream
    assert 1 <= pool.idle_count(backends[0].url) <= 40
    assert json.loads(backends[0].seen[-1].body)["model"] == "fake-model"


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        # not HTTP, after the request: retried as vllm-router retries it, then a 502
        (b"SPDY/9 700 Nope\r\n\r\n", "upstream_unreachable"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n" + OK_BODY[:10], "upstream_error"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", None),  # bad chunk
    ],
)
async def test_broken_upstream_answers_are_errors_and_release(
    answer: bytes, code: str | None, raw: RawBackend, make_router: MakeRouter
) -> None:
    """502 when nothing was relayed yet; a truncated response once the stream started."""
    raw.respond = lambda head: (answer, True)
    router = await make_router([raw.url], retry_max_retries=2)
    async with aiohttp.ClientSession() as client:
        if code is None:
            with pytest.raises(aiohttp.ClientPayloadError):
                await post_chat(client, router, "b")
        else:
            status, body = await post_chat(client, router, "b")
            assert status == 502 and body["error"]["code"] == code
    assert router.router.core.cluster.in_flight(raw.url) == 0
    assert router.router.upstream.idle_count(raw.url) == 0


async def test_a_connection_idle_past_the_keepalive_is_not_reused(raw: RawBackend) -> None:
    """A pooled connection idle for longer than ``keepalive_s`` is closed, not reused: the
    worker (vLLM closes idle connections after 5 s) may be closing it at that moment."""
    pool = UpstreamPool(timeout_s=5.0, connect_timeout_s=5.0, keepalive_s=0.05)
    pool.start()
    task = asyncio.current_task()
    assert task is not None
    parts = (pool.request_head(raw.url, "POST", b"/v1/chat") + b"Content-Length: 2\r\n\r\n", b"{}")

    async def exchange() -> None:
        ex = Exchange(pool, raw.url, task)
        try:
            assert await ex.send(parts) == 200
            await ex.read()
        finally:
            ex.close()

    try:
        await exchange()
        await exchange()  # back to back: the same connection
        assert raw.connections == 1 and pool.idle_count(raw.url) == 1
        await asyncio.sleep(0.1)  # idle past the keep-alive (the 10 s prune has not run)
        await exchange()
        assert raw.connections == 2  # a new connection; the stale one was closed
        assert pool.idle_count(raw.url) == 1
    finally:
        await pool.close()


class _Recorder:
    """A :class:`ResponseHandler` that writes down what its connection tells it."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []
        self.done = asyncio.get_running_loop().create_future()

    def request_sent(self) -> None:
        self.events.append(("sent",))

    def response_head(
        self, status: int, keep_alive: bool, framed: bool, length: int | None, lines: list[bytes]
    ) -> None:
        self.events.append(("head", status, keep_alive, framed, length, b"".join(lines)))

    def response_body(self, piece: bytes) -> None:
        self.events.append(("body", piece))

    def response_complete(self) -> None:
        self.events.append(("complete",))

    def read_done(self) -> None:
        if self.events and self.events[-1] != ("read",):
            self.events.append(("read",))
        if ("complete",) in self.events and not self.done.done():
            self.done.set_result(None)

    def fail(self, error: UpstreamError) -> None:
        self.events.append(("fail", str(error)))
        if not self.done.done():
            self.done.set_result(None)

    def connection_closed(self, exc: BaseException | None) -> None:
        self.events.append(("closed",))


async def test_a_worker_connection_tells_its_handler_what_arrived(raw: RawBackend) -> None:
    """The whole interface between a connection and its exchange: a 1xx is skipped, the
    head comes once with the lines to relay (framing, Date and Server left out), then each
    body piece, the end, and after each read ``read_done``; a response nobody asked for is
    a failure and closes the connection."""
    raw.respond = lambda head: (
        [
            b"HTTP/1.1 100 Continue\r\nX-Early: 1\r\n\r\n",
            b"HTTP/1.1 201 Made\r\nX-A: 1\r\nServer: w\r\nDate: d\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n",
            b"2\r\ncd\r\n0\r\n\r\n",
        ],
        False,
    )
    pool = UpstreamPool(timeout_s=5.0, connect_timeout_s=5.0)
    conn = await pool.connect(raw.url)
    try:
        first = _Recorder()
        request = pool.request_head(raw.url, "POST", b"/v1/x") + b"Content-Length: 0\r\n\r\n"
        assert conn.send(first, [request])  # written at once
        await first.done
        events = [e for e in first.events if e != ("read",)]
        assert events == [
            ("head", 201, True, True, None, b"X-A: 1\r\n"),
            ("body", b"ab"),
            ("body", b"cd"),
            ("complete",),
        ]
        assert first.events[-1] == ("read",) and first.events.count(("read",)) >= 2
        # a second response to the one request: a protocol error, the connection closes
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        assert [e for e in first.events if e[0] == "fail"] == [
            ("fail", "malformed response: unsolicited response")
        ]
        assert conn.lost
        conn.release()
        with pytest.raises(UpstreamError, match="closed"):
            conn.send(_Recorder(), [request])
    finally:
        conn.close()
        await pool.close()
