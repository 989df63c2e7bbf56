"""A recording pass-through in front of each replica: which replica served which session.

Neither vLLM nor its routers say which replica answered a request. A :class:`Tap` listens on
its own port, forwards every request to its replica unchanged (method, path, query, headers but
hop-by-hop ones, body; the response relayed chunk by chunk as it arrives, so streaming stays
streaming) and notes the session header of generation requests. The router is given the taps'
URLs instead of the replicas'. Used for per-replica session counts, session moves and the
``replica`` of each turn; one local hop of overhead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

__all__ = ["Tap", "TapRecord", "start_taps"]

_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    )
)
_GENERATION = ("/v1/chat/completions", "/v1/completions")


@dataclass(slots=True)
class TapRecord:
    """What one tap saw.

    Attributes:
        requests: generation requests forwarded.
        sessions: session id -> generation requests of that session.
        no_session: generation requests without the session header.
    """

    requests: int = 0
    sessions: Counter[str] = field(default_factory=Counter)
    no_session: int = 0


class Tap:
    """One pass-through (see the module docstring).

    Args:
        index: the replica's index.
        upstream: the replica's base URL.
        header: the session header to record (lower case).
        last_replica: shared map session id -> index of the replica that got its latest
            generation request (written by every tap).
    """

    def __init__(
        self, index: int, upstream: str, header: str, last_replica: dict[str, int]
    ) -> None:
        self.index = index
        self.upstream = upstream.rstrip("/")
        self.header = header
        self.record = TapRecord()
        self._last = last_replica
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``port`` (0: a free one); returns the tap's URL."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        port = next(a[1] for a in self._runner.addresses if isinstance(a, tuple))
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Stop listening and close the upstream pool; safe to call twice."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def reset(self) -> None:
        """Forget what was recorded."""
        self.record = TapRecord()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path in _GENERATION and request.method == "POST":
            rec = self.record
            rec.requests += 1
            sid = request.headers.get(self.header)
            if sid:
                rec.sessions[sid] += 1
                self._last[sid] = self.index
            else:
                rec.no_session += 1
        session = self._session
        if session is None:
            raise web.HTTPServiceUnavailable(text="tap stopped")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        body = await request.read()
        try:
            async with session.request(
                request.method,
                self.upstream + request.rel_url.path_qs,
                headers=headers,
                data=body if body else None,
            ) as up:
                resp = web.StreamResponse(status=up.status, reason=up.reason)
                for k, v in up.headers.items():
                    if k.lower() not in _HOP:
                        resp.headers.add(k, v)
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except aiohttp.ClientConnectionError:
            raise web.HTTPBadGateway(text=f"replica {self.upstream} unreachable") from None


async def start_taps(
    upstreams: Sequence[str],
    header: str,
    host: str = "127.0.0.1",
    ports: Sequence[int] | None = None,
) -> tuple[list[Tap], dict[str, int]]:
    """A started :class:`Tap` per replica, and their shared session -> replica map.

    Args:
        upstreams: the replicas' URLs.
        header: the session header to record.
        host: listen address.
        ports: the taps' ports (None or 0: free ports).

    Raises:
        OSError: a port could not be bound (the taps started are stopped).
    """
    last: dict[str, int] = {}
    taps: list[Tap] = []
    try:
        for i, url in enumerate(upstreams):
            tap = Tap(i, url, header.lower(), last)
            taps.append(tap)
            await tap.start(host, ports[i] if ports and i < len(ports) else 0)
    except BaseException:
        for t in taps:
            await t.stop()
        raise
    return taps, last
