"""Keep-alive HTTP/1.1 connections to the workers, on aiohttp's own client protocol.

The proxied routes do not go through :class:`aiohttp.ClientSession`: its per-request
orchestration (``ClientRequest``/``ClientResponse`` objects, cookie, redirect, auth, proxy and
tracing hooks, timer contexts, connector bookkeeping) cost about 250 microseconds of CPU per
request on the project's VM, as much as vllm-router's whole request. What stays is aiohttp's
HTTP machinery: :class:`aiohttp.client_proto.ResponseHandler` (the protocol every aiohttp
client connection uses) with its C ``llhttp`` response parser, which frames responses
(``Content-Length``, chunked, read-until-close), validates them and exposes the body as an
:class:`aiohttp.StreamReader`; broken connections surface as aiohttp's exceptions
(:class:`aiohttp.ServerDisconnectedError`, :class:`aiohttp.ClientOSError`,
:class:`aiohttp.ClientPayloadError`). Ours is only the request head (request line, the
client's headers as received, ``Host``, ``Content-Length``), a LIFO pool of idle connections
per worker and a deadline watchdog.

A connection goes back to the pool only when its response was read to the end and neither
side asked to close it; a connection that broke, timed out or was abandoned (the client went
away) is closed, so the worker sees the close and can stop generating.

Timeouts: every :class:`Exchange` has a deadline. One watchdog task per pool checks the oldest
exchanges every ``tick`` seconds (a tenth of the timeout, at most 1 s) and cancels the task of
each expired one, like ``asyncio.timeout`` but without a timer per request (a uvloop timer
costs about 5 microseconds to arm and cancel). Because every exchange has the same timeout,
registration order is deadline order and the check stops at the first live exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.http import RawResponseMessage
from aiohttp.streams import StreamReader
from yarl import URL

__all__ = ["HOP_BY_HOP", "REQUEST_DROP", "Exchange", "UpstreamConnectError", "UpstreamPool"]

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers never forwarded in either direction (RFC 9110 section 7.6.1)."""

REQUEST_DROP = frozenset(n.encode() for n in (*HOP_BY_HOP, "host", "content-length", "expect"))
"""Lower-case request header names never forwarded upstream (the router sets Host and
Content-Length itself, and it has already answered any ``Expect: 100-continue``)."""


class UpstreamConnectError(aiohttp.ClientConnectionError):
    """The worker refused the connection, or did not accept it within the connect timeout."""


@dataclass(slots=True)
class _Target:
    host: str
    port: int
    ssl: ssl.SSLContext | None
    host_header: bytes
    base_path: str
    idle: list[tuple[ResponseHandler, float]] = field(default_factory=list)


class Exchange:
    """One request/response exchange with a worker.

    Creating it registers its deadline (now plus the pool's ``timeout_s``) with the pool's
    watchdog, which cancels ``task`` when it passes (see :meth:`is_timeout`). Always
    :meth:`close` it (``try/finally``).

    Args:
        pool: the pool the connection comes from.
        worker: the worker base URL.
        task: the task that awaits the exchange (the request handler's).

    Attributes:
        worker: the worker base URL.
        deadline: ``time.monotonic()`` by which the exchange must end (seconds).
        timed_out: True once the watchdog cancelled the owning task for this exchange.
        message: the response status line and headers (after :meth:`send`).
        payload: the response body stream (after :meth:`send`).
    """

    __slots__ = (
        "_cancelling",
        "_pool",
        "_proto",
        "_task",
        "_uncancelled",
        "deadline",
        "message",
        "payload",
        "timed_out",
        "worker",
    )

    def __init__(self, pool: UpstreamPool, worker: str, task: asyncio.Task[Any]) -> None:
        self._pool = pool
        self._task = task
        self._cancelling = task.cancelling()
        self._uncancelled = False
        self._proto: ResponseHandler | None = None
        self.worker = worker
        self.deadline = time.monotonic() + pool.timeout_s
        self.timed_out = False
        self.message: RawResponseMessage | None = None
        self.payload: StreamReader | None = None
        pool._inflight[self] = None

    async def send(self, parts: Iterable[bytes]) -> RawResponseMessage:
        """Send the request (``parts``: head and body) and wait for the response headers.

        Informational (1xx) responses are skipped. The body is then read from
        :attr:`payload`.

        Raises:
            UpstreamConnectError: no connection could be made (nothing was sent).
            aiohttp.ClientError: the connection broke or the response was malformed.
            asyncio.CancelledError: the owning task was cancelled (see :attr:`timed_out`).
        """
        pool = self._pool
        target = pool._targets.get(self.worker) or pool._target(self.worker)
        idle = target.idle
        proto = None
        while idle:  # the most recently used first; past-keep-alive ones are pruned
            cand = idle.pop()[0]
            transport = cand.transport
            if transport is not None and not transport.is_closing():
                proto = cand
                break
            cand.close()
        if proto is None:
            proto = await pool._connect(target)
        self._proto = proto
        transport = proto.transport
        if transport is None:
            raise aiohttp.ServerDisconnectedError()
        transport.writelines(parts)
        while True:
            message, payload = await proto.read()
            code = message.code
            if code < 100 or code > 199 or code == 101:
                self.message = message
                self.payload = payload
                return message

    def expire(self) -> None:
        """Called by the watchdog when the deadline passed: cancel the owning task."""
        if not self.timed_out:
            self.timed_out = True
            self._task.cancel()

    def is_timeout(self) -> bool:
        """Call in ``except asyncio.CancelledError``: True when the cancellation is this
        exchange's timeout and nothing else (the task is then un-cancelled and may go on);
        False when it must propagate (the client went away, or the task is being stopped).

        The same rule as ``asyncio.timeout``.
        """
        if not self.timed_out:
            return False
        if not self._uncancelled:
            self._uncancelled = True
            return self._task.uncancel() <= self._cancelling
        return self._task.cancelling() <= self._cancelling

    def close(self) -> None:
        """End the exchange: keep the connection if the response was read to the end.

        Anything else (an error, a timeout, a body not read to the end) closes it.
        Idempotent.
        """
        self._pool._inflight.pop(self, None)
        proto = self._proto
        if proto is None:
            return
        self._proto = None
        payload = self.payload
        if self.timed_out or payload is None or not payload.is_eof() or proto.should_close:
            proto.close()
            return
        target = self._pool._targets.get(self.worker)
        if target is None or len(target.idle) >= self._pool._max_idle:
            proto.close()  # a removed worker, or more idle connections than kept
        else:
            target.idle.append((proto, time.monotonic()))


class UpstreamPool:
    """Pooled keep-alive connections to the workers, with a deadline watchdog.

    Args:
        timeout_s: seconds an exchange may take, response body included.
        connect_timeout_s: seconds to wait for a TCP (and TLS) connection.
        read_bufsize: bytes the response parser buffers before pausing the socket.
        keepalive_s: idle connections are closed after this many seconds (checked every
            10 s); a connection the worker closed is never reused.
        max_idle: idle connections kept per worker (more are closed on release).
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        read_bufsize: int = 2**18,
        keepalive_s: float = 60.0,
        max_idle: int = 1024,
    ) -> None:
        self.timeout_s = timeout_s
        self._connect_timeout = connect_timeout_s
        self._bufsize = read_bufsize
        self._keepalive = keepalive_s
        self._max_idle = max_idle
        self._tick = max(0.005, min(1.0, timeout_s / 10))
        self._targets: dict[str, _Target] = {}
        self.heads: dict[tuple[str, str, str], bytes] = {}
        """Memo of :meth:`request_head` by (worker, method, path and query)."""
        self._inflight: dict[Exchange, None] = {}
        self._watchdog: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the watchdog (call on the event loop)."""
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(
                self._watch(), name="sessionroute-upstream-watchdog"
            )

    async def close(self) -> None:
        """Stop the watchdog and close every idle connection."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        for target in self._targets.values():
            for proto, _ in target.idle:
                proto.close()
            target.idle.clear()

    async def _watch(self) -> None:
        inflight = self._inflight
        last_prune = time.monotonic()
        while True:
            await asyncio.sleep(self._tick)
            now = time.monotonic()
            expired = []
            for ex in inflight:
                if ex.deadline > now:
                    break
                expired.append(ex)
            for ex in expired:
                inflight.pop(ex, None)
                ex.expire()
            if now - last_prune >= 10.0:
                last_prune = now
                self.prune()

    # -- exchanges ------------------------------------------------------------------------
    def exchange(self, worker: str, task: asyncio.Task[Any]) -> Exchange:
        """A new exchange with ``worker``, owned by ``task`` (the one that will await it).

        Its deadline is now plus ``timeout_s``; when it passes, ``task`` is cancelled (see
        :meth:`Exchange.is_timeout`). Always :meth:`Exchange.close` it (``try/finally``).
        The same as ``Exchange(pool, worker, task)``.
        """
        return Exchange(self, worker, task)

    def request_head(self, worker: str, method: str, path_qs: str) -> bytes:
        """``METHOD /base/path?q HTTP/1.1\\r\\nHost: h:p\\r\\n`` for ``worker`` (memoized).

        Raises:
            UpstreamConnectError: ``worker`` is not an http(s) URL with a host.
        """
        key = (worker, method, path_qs)
        head = self.heads.get(key)
        if head is None:
            if len(self.heads) >= 4096:
                self.heads.clear()
            target = self._target(worker)
            head = self.heads[key] = (
                f"{method} {target.base_path}{path_qs} HTTP/1.1\r\n".encode(
                    "utf-8", "surrogateescape"
                )
                + b"Host: "
                + target.host_header
                + b"\r\n"
            )
        return head

    def _target(self, worker: str) -> _Target:
        target = self._targets.get(worker)
        if target is None:
            url = URL(worker)
            host = url.raw_host
            if url.scheme not in ("http", "https") or not host:
                raise UpstreamConnectError(f"unsupported worker url: {worker!r}")
            tls = ssl.create_default_context() if url.scheme == "https" else None
            port = url.port if url.port is not None else (443 if tls else 80)
            name = f"[{host}]" if ":" in host else host
            host_header = name if url.is_default_port() else f"{name}:{port}"
            target = self._targets[worker] = _Target(
                host, port, tls, host_header.encode("ascii"), url.raw_path.rstrip("/")
            )
        return target

    async def _connect(self, target: _Target) -> ResponseHandler:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, proto = await loop.create_connection(
                    lambda: ResponseHandler(loop),
                    target.host,
                    target.port,
                    ssl=target.ssl,
                )
        except TimeoutError as exc:
            raise UpstreamConnectError(f"no connection within {self._connect_timeout:g} s") from exc
        except OSError as exc:
            raise UpstreamConnectError(f"{type(exc).__name__}: {exc}") from exc
        proto.set_response_params(
            read_until_eof=True, auto_decompress=False, read_bufsize=self._bufsize
        )
        return proto

    def forget(self, worker: str) -> None:
        """Close ``worker``'s idle connections and forget it (a removed worker)."""
        target = self._targets.pop(worker, None)
        if target is not None:
            for proto, _ in target.idle:
                proto.close()
        self.heads = {k: v for k, v in self.heads.items() if k[0] != worker}

    def prune(self) -> int:
        """Close idle connections that are closed or past the keep-alive; returns how many."""
        now = time.monotonic()
        n = 0
        for target in self._targets.values():
            keep = []
            for proto, since in target.idle:
                if proto.is_connected() and now - since < self._keepalive:
                    keep.append((proto, since))
                else:
                    proto.close()
                    n += 1
            target.idle[:] = keep
        return n

    def idle_count(self, worker: str) -> int:
        """Idle connections pooled for ``worker``."""
        target = self._targets.get(worker)
        return len(target.idle) if target is not None else 0
