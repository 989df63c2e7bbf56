"""Keep-alive HTTP/1.1 connections to the workers, pooled per worker, with a deadline watchdog.

The proxied routes talk to the workers through a protocol of ours
(:class:`~sessionroute.serve.worker_connection.WorkerConnection`, on the ``httptools``
response parser) rather than :class:`aiohttp.ClientSession`, whose per-request machinery (a
``StreamReader``, a header ``CIMultiDict`` and a message object per response, and its request
orchestration) cost as much CPU as vllm-router spends on a whole request. aiohttp stays the
client of health checks and admin calls.

Three modules, one direction of use:

- :mod:`~sessionroute.serve.worker_connection`: one connection and its response parser; it
  tells the request using it what arrived through
  :class:`~sessionroute.serve.worker_connection.ResponseHandler`.
- this module: :class:`UpstreamPool`, the connections per worker (a LIFO list of idle ones),
  the request heads, and the deadline watchdog;
- :mod:`~sessionroute.serve.exchange`: :class:`~sessionroute.serve.exchange.Exchange`, one
  request and its response, which takes a connection from the pool and gives it back.

A connection goes back to the pool only when its response was read to the end and neither
side asked to close it; a connection that broke, timed out or was abandoned (the client went
away) is closed, so the worker sees the close and can stop generating.

Timeouts: every exchange has a deadline. One watchdog task per pool checks the oldest
exchanges every ``tick`` seconds (a tenth of the timeout, at most 1 s) and expires each one
past its deadline, like ``asyncio.timeout`` but without a timer per request. Because every
exchange has the same timeout, registration order is deadline order and the check stops at
the first live exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from yarl import URL

from sessionroute.router.actions import WorkerLost
from sessionroute.router.retry import WorkerLostAction
from sessionroute.serve.worker_connection import (
    HOP_BY_HOP,
    UpstreamConnectError,
    UpstreamError,
    UpstreamHung,
    WorkerConnection,
)

if TYPE_CHECKING:  # (exchange.py uses the pool; the pool only tracks its exchanges)
    from sessionroute.serve.exchange import Exchange

__all__ = [
    "HOP_BY_HOP",
    "REQUEST_DROP",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamHung",
    "UpstreamPool",
    "WorkerConnection",
]

REQUEST_DROP = frozenset(n.encode() for n in (*HOP_BY_HOP, "host", "content-length", "expect"))
"""Lower-case request header names never forwarded upstream (the router sets Host and
Content-Length itself, and it has already answered any ``Expect: 100-continue``)."""


@dataclass(slots=True)
class _Target:
    host: str
    port: int
    ssl: ssl.SSLContext | None
    host_header: bytes
    base_path: str
    idle: list[tuple[WorkerConnection, float]] = field(default_factory=list)


class UpstreamPool:
    """Pooled keep-alive connections to the workers, with a deadline watchdog.

    Args:
        timeout_s: seconds an exchange may take, response body included.
        connect_timeout_s: seconds to wait for a TCP (and TLS) connection.
        keepalive_s: an idle connection is not reused after this many seconds (and is closed
            within 10 s more); a connection the worker closed is never reused. Keep it below
            the workers' own keep-alive, or a request may go out on a connection the worker is
            closing at that moment.
        max_idle: idle connections kept per worker (more are closed on release).
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        keepalive_s: float = 60.0,
        max_idle: int = 1024,
    ) -> None:
        self.timeout_s = timeout_s
        self._connect_timeout = connect_timeout_s
        self.keepalive_s = keepalive_s
        self._max_idle = max_idle
        self._tick = max(0.005, min(1.0, timeout_s / 10))
        self._targets: dict[str, _Target] = {}
        self._heads: dict[tuple[str, str, bytes], bytes] = {}
        """Memo of :meth:`request_head` by (worker, method, request target)."""
        self._inflight: dict[Exchange, None] = {}
        """Exchanges in deadline order (the watchdog stops at the first live one)."""
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
            for conn, _ in target.idle:
                conn.close()
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

    # -- used by the exchanges ---------------------------------------------------------------
    def track(self, ex: Exchange) -> None:
        """Watch ``ex``'s deadline (registered in deadline order: each has ``timeout_s``)."""
        self._inflight[ex] = None

    def untrack(self, ex: Exchange) -> None:
        """Stop watching ``ex`` (idempotent)."""
        self._inflight.pop(ex, None)

    def take_idle(self, worker: str, now: float) -> WorkerConnection | None:
        """The most recently used idle connection to ``worker`` that is open and was idle for
        less than ``keepalive_s`` at ``now`` (``time.monotonic()``), taken out of the pool;
        None when there is none (those closed or stale are closed and dropped).

        """
        target = self._targets.get(worker)
        if target is None:  # never connected to (or removed): nothing idle
            return None
        idle = target.idle
        stale = now - self.keepalive_s  # idle since before: the worker may be closing it now
        while idle:
            conn, since = idle.pop()
            if not conn.lost and since > stale:
                return conn
            conn.close()
        return None

    async def connect(self, worker: str) -> WorkerConnection:
        """A new connection to ``worker``.

        Raises:
            UpstreamConnectError: refused, not made within the connect timeout, or
                ``worker`` is not an http(s) URL with a host.
        """
        target = self._target(worker)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    WorkerConnection, target.host, target.port, ssl=target.ssl
                )
        except TimeoutError as exc:
            raise UpstreamConnectError(f"no connection within {self._connect_timeout:g} s") from exc
        except OSError as exc:
            raise UpstreamConnectError(f"{type(exc).__name__}: {exc}") from exc
        return conn

    def give_back(self, worker: str, conn: WorkerConnection) -> None:
        """Keep ``conn`` (its last response read to the end) as ``worker``'s most recently
        used idle connection; close it for a removed worker or past ``max_idle``."""
        target = self._targets.get(worker)
        if target is None or len(target.idle) >= self._max_idle:
            conn.close()
        else:
            target.idle.append((conn, time.monotonic()))

    # -- requests -------------------------------------------------------------------------
    def request_head(self, worker: str, method: str, target: bytes) -> bytes:
        """``METHOD /base/path?q HTTP/1.1\\r\\nHost: h:p\\r\\n`` for ``worker`` (memoized).

        Args:
            worker: the worker base URL.
            method: the request method.
            target: the path and query as the client sent them (bytes, not re-encoded).

        Raises:
            UpstreamConnectError: ``worker`` is not an http(s) URL with a host.
        """
        key = (worker, method, target)
        head = self._heads.get(key)
        if head is None:
            if len(self._heads) >= 4096:
                self._heads.clear()
            t = self._target(worker)
            head = self._heads[key] = b"%s %s%s HTTP/1.1\r\nHost: %s\r\n" % (
                method.encode("ascii", "replace"),
                t.base_path.encode("utf-8", "surrogateescape"),
                target,
                t.host_header,
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

    def forget(self, worker: str) -> None:
        """Close ``worker``'s idle connections and forget it (a removed worker)."""
        target = self._targets.pop(worker, None)
        if target is not None:
            for conn, _ in target.idle:
                conn.close()
        self._heads = {k: v for k, v in self._heads.items() if k[0] != worker}

    def prune(self) -> int:
        """Close idle connections that are closed or past the keep-alive; returns how many."""
        now = time.monotonic()
        n = 0
        for target in self._targets.values():
            keep = []
            for conn, since in target.idle:
                if not conn.lost and now - since < self.keepalive_s:
                    keep.append((conn, since))
                else:
                    conn.close()
                    n += 1
            target.idle[:] = keep
        return n

    def in_flight_on(self, worker: str) -> list[Exchange]:
        """The exchanges in progress with ``worker`` (O(exchanges in flight))."""
        return [ex for ex in self._inflight if ex.worker == worker]

    def give_up(
        self, lost: WorkerLost, decide: Callable[[bool], WorkerLostAction]
    ) -> tuple[int, int]:
        """``lost.url`` stopped answering: act on each exchange in flight there as ``decide``
        (the core's :meth:`~sessionroute.router.RoutingCore.on_worker_lost`) says, by whether
        its answer is being relayed to the client. Those to re-place are given up as hung
        (they fail as hung, and the core places them again: the session moves, a re-pin);
        those watched keep going while bytes arrive, and are cut (a truncated stream) if none
        arrive for ``lost.quiet_s``.

        Returns:
            How many exchanges were given up for re-placement, and how many are watched.
        """
        replaced = 0
        watched: list[tuple[Exchange, int]] = []
        for ex in self.in_flight_on(lost.url):
            if decide(ex.relaying) is WorkerLostAction.REPLACE:
                replaced += ex.hang(f"worker unavailable: {lost.reason}")
            else:
                watched.append((ex, ex.chunks))
        if watched:
            quiet_s = lost.quiet_s
            asyncio.get_running_loop().call_later(quiet_s, _cut_stalled, watched, quiet_s)
        return replaced, len(watched)

    def idle_count(self, worker: str) -> int:
        """Idle connections pooled for ``worker``."""
        target = self._targets.get(worker)
        return len(target.idle) if target is not None else 0


def _cut_stalled(watched: list[tuple[Exchange, int]], quiet_s: float) -> None:
    """End the watched exchanges that received nothing since they were watched."""
    for ex, chunks in watched:
        if ex.chunks == chunks and not ex.complete:
            ex.cut(f"the worker is unavailable and sent nothing for {quiet_s:g} s")
