"""The ``floor`` target of ``sessionroute bench proxy``: the least a parsing Python proxy does.

A reference for the router's overhead, not a router: uvloop and httptools parse both ways, a
GET is answered 200 at once (the bench's readiness probe), a POST's body is parsed as JSON
(``pydantic_core.from_json``, as the router does) and checked to be an object with ``model``
and a ``messages`` list (else 400), and the request is relayed over a pool of keep-alive
connections to the one backend (503 when every one is busy), with its headers (hop-by-hop
ones aside) and a request id added to the answer. No limits, timeouts, retries, auth,
metrics, session table or policy: what ``sessionroute serve`` costs above this is the price
of those (``docs/benchmarks.md``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic_core

__all__ = ["floor_main"]

_HOP = frozenset((b"connection", b"content-length", b"host", b"keep-alive", b"date", b"server"))


class _Backend(asyncio.Protocol):
    """One pooled keep-alive connection to the backend; answers its current client."""

    def __init__(self, pool: list[_Backend]) -> None:
        import httptools

        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.client: _Client | None = None
        self.transport: Any = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.pool.append(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.headers = []
        self.body = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        self.pool.append(self)
        if client is None:
            return
        body = b"".join(self.body)
        head = b"".join(n + b": " + v + b"\r\n" for n, v in self.headers if n.lower() not in _HOP)
        status = self.parser.get_status_code()
        client.transport.write(
            b"HTTP/1.1 %d OK\r\n%bcontent-length: %d\r\nx-request-id: %b\r\n\r\n%b"
            % (status, head, len(body), client.request_id, body)
        )


class _Client(asyncio.Protocol):
    """One client connection: parse, check, relay."""

    def __init__(self, pool: list[_Backend], counter: list[int]) -> None:
        import httptools

        self.pool = pool
        self.counter = counter
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.url = b"/"
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.request_id = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.headers = {}
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.parser.get_method() == b"GET":  # readiness probes (GET /health)
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            return
        body = b"".join(self.body)
        try:
            doc = pydantic_core.from_json(body)  # the router's parser (the fastest here)
            ok = isinstance(doc, dict) and "model" in doc and isinstance(doc.get("messages"), list)
        except ValueError:
            ok = False
        if not ok:
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            return
        if not self.pool:  # more requests in flight than pooled connections
            self.transport.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
            return
        self.counter[0] += 1
        self.request_id = b"floor-%d" % self.counter[0]
        backend = self.pool.pop()
        backend.client = self
        head = b"".join(k + b": " + v + b"\r\n" for k, v in self.headers.items() if k not in _HOP)
        backend.transport.write(
            b"POST %b HTTP/1.1\r\nhost: backend\r\n%bcontent-length: %d\r\n\r\n%b"
            % (self.url, head, len(body), body)
        )


def floor_main(port: int, backend_port: int, connections: int = 64) -> None:
    """Serve on 127.0.0.1:``port`` in front of the backend on ``backend_port`` until killed
    (``connections`` keep-alive connections to it, opened at start; one request each at a
    time, so at most that many requests in flight)."""
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool: list[_Backend] = []
        for _ in range(600):  # the backend may still be starting
            try:
                await loop.create_connection(lambda: _Backend(pool), "127.0.0.1", backend_port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        for _ in range(connections - 1):
            await loop.create_connection(lambda: _Backend(pool), "127.0.0.1", backend_port)
        counter = [0]
        await loop.create_server(lambda: _Client(pool, counter), "127.0.0.1", port)
        await asyncio.Event().wait()

    uvloop.run(main())
