"""A small fake router (real aiohttp on 127.0.0.1) for the client tests, plus its own checks.

It speaks just enough of ``shared/ROUTER.md`` and OpenAI's wire format: chat completions
(streaming and not), ``/v1/models``, ``/health``, ``/echo`` and ``/finish_session``, so it can
also stand in for a vLLM replica behind the real router. It records the headers of every
request and every ``finish_session`` call, and can be told to answer with scripted statuses, to
fail the first chat calls, or to hang until it is stopped.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
from aiohttp import web


@dataclass
class Seen:
    """One request the fake router received."""

    path: str
    headers: dict[str, str]
    body: dict[str, object]

    @property
    def session(self) -> str | None:
        return self.headers.get("x-session-id")


@dataclass
class FakeRouter:
    """State and knobs of one fake router; start it with :func:`fake_router`."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    finishes: list[str] = field(default_factory=list)
    finish_statuses: list[int] = field(default_factory=list)
    finish_hang: bool = False
    chat_hang: bool = False
    chat_failures: int = 0
    chat_started: asyncio.Event = field(default_factory=asyncio.Event)
    finish_started: asyncio.Event = field(default_factory=asyncio.Event)
    unblock: asyncio.Event = field(default_factory=asyncio.Event)

    def sessions(self, path: str) -> list[str | None]:
        """The session header of each request to ``path``, in arrival order."""
        return [s.session for s in self.seen if s.path == path]

    async def _record(self, request: web.Request) -> None:
        body: dict[str, object] = {}
        if request.can_read_body:
            raw = await request.read()
            body = json.loads(raw) if raw else {}
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.seen.append(Seen(request.path, headers, body))

    async def finish_session(self, request: web.Request) -> web.Response:
        await self._record(request)
        sid = request.query.get("session_id")
        self.finishes.append(sid if sid is not None else "<missing>")
        self.finish_started.set()
        if self.finish_hang:
            await self.unblock.wait()
        status = self.finish_statuses.pop(0) if self.finish_statuses else 200
        return web.json_response({"status": "ok", "session_id": sid}, status=status)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        self.chat_started.set()
        if self.chat_hang:
            await self.unblock.wait()
        if self.chat_failures > 0:
            self.chat_failures -= 1
            error = {"error": {"message": "upstream 500", "type": "server_error", "code": 500}}
            return web.json_response(error, status=500, headers={"retry-after-ms": "1"})
        body = self.seen[-1].body
        if body.get("stream"):
            return await self._stream(request, ["Hel", "lo"])
        message = {"role": "assistant", "content": "Hello"}
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": str(body.get("model", "m")),
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }
        )

    async def _stream(self, request: web.Request, pieces: list[str]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for i, piece in enumerate(pieces):
            delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
            chunk = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def models(self, request: web.Request) -> web.Response:
        await self._record(request)
        model = {"id": "fake-model", "object": "model", "created": 0, "owned_by": "test"}
        return web.json_response({"object": "list", "data": [model]})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def echo(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"session": request.headers.get("x-session-id")})


@asynccontextmanager
async def fake_router() -> AsyncIterator[FakeRouter]:
    """Run a :class:`FakeRouter` on 127.0.0.1 (a free port) for the ``async with`` body."""
    state = FakeRouter()
    app = web.Application()
    app.router.add_post("/finish_session", state.finish_session)
    app.router.add_post("/v1/chat/completions", state.chat)
    app.router.add_get("/v1/models", state.models)
    app.router.add_get("/health", state.health)
    app.router.add_route("*", "/echo", state.echo)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    state.url = f"http://{host}:{port}"
    try:
        yield state
    finally:
        state.unblock.set()
        await runner.cleanup()


def closed_port_url() -> str:
    """The URL of a 127.0.0.1 port nothing listens on (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_fake_router_finish_session_answers_like_the_contract() -> None:
    async with fake_router() as router, httpx.AsyncClient() as client:
        response = await client.post(f"{router.url}/finish_session", params={"session_id": "a b"})
        assert response.status_code == 200
        assert response.json() == {"status": "ok", "session_id": "a b"}
        assert router.finishes == ["a b"]


async def test_closed_port_refuses_connections() -> None:
    async with httpx.AsyncClient() as client:
        try:
            await client.get(closed_port_url())
        except httpx.ConnectError:
            return
    raise AssertionError("a closed port accepted a connection")
