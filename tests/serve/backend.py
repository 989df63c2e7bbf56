"""A small fake vLLM replica for router tests: a real aiohttp server on 127.0.0.1.

It records every generation request (session header, path, body, headers), answers chat and
completions in OpenAI's shape, streams server-sent events (optionally held at gates so tests
can observe events arriving before the backend finishes), can be told to fail the next N
requests with given statuses, can fail its health checks, and can be killed and restarted on
the same port.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Seen:
    """One generation request the backend received."""

    path: str
    session: str | None
    body: bytes
    headers: dict[str, str]


@dataclass
class FakeBackend:
    """A vLLM-like replica. Start with :meth:`start`; ``url`` is ``http://127.0.0.1:PORT``."""

    port: int = 0
    seen: list[Seen] = field(default_factory=list)
    fail_statuses: list[int] = field(default_factory=list)
    health_ok: bool = True
    health_checks: int = 0
    stream_events: int = 3
    gates: dict[int, asyncio.Event] = field(default_factory=dict)
    sent: dict[int, asyncio.Event] = field(default_factory=dict)
    stream_cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    stream_finished: asyncio.Event = field(default_factory=asyncio.Event)
    hold: asyncio.Event | None = None
    metrics_text: str | None = None
    """Served at ``GET /metrics`` when set (404 otherwise)."""
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sessions(self) -> list[str | None]:
        return [s.session for s in self.seen]

    async def start(self) -> FakeBackend:
        app = web.Application()
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"):
            app.router.add_post(path, self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/get_server_info", self._server_info)
        app.router.add_post("/generate", self._generate)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        for addr in self._runner.addresses:
            self.port = int(addr[1])
        return self

    async def kill(self) -> None:
        """Close the listener and every connection (connections are then refused)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, request: web.Request) -> web.Response:
        self.health_checks += 1
        if self.health_ok:
            return web.Response(text="")
        return web.Response(status=503, text="unhealthy")

    async def _server_info(self, request: web.Request) -> web.Response:
        return web.json_response({"port": self.port, "query": request.query_string})

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics_text is None:
            raise web.HTTPNotFound()
        return web.Response(text=self.metrics_text, content_type="text/plain")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "fake-model", "object": "model", "port": self.port}]}
        )

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(
            Seen(request.path, request.headers.get("x-session-id"), body, dict(request.headers))
        )
        if self.fail_statuses:
            status = self.fail_statuses.pop(0)
            return web.json_response(
                {"error": {"message": f"injected {status}", "type": "x", "code": status}},
                status=status,
            )
        try:
            payload: Any = json.loads(body)
        except ValueError:
            return web.json_response(
                {"error": {"message": "backend: bad json", "type": "BadRequestError"}},
                status=400,
            )
        if self.hold is not None:
            await self.hold.wait()
        if isinstance(payload, dict) and payload.get("stream"):
            return await self._stream(request, payload)
        return web.json_response(self._completion(request.path, payload))

    def _completion(self, path: str, payload: Any) -> dict[str, Any]:
        model = payload.get("model", "fake-model") if isinstance(payload, dict) else "fake-model"
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        if path == "/v1/completions":
            return {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "text": f"port {self.port}", "finish_reason": "stop"}],
                "usage": usage,
            }
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"port {self.port}"},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }

    async def _stream(self, request: web.Request, payload: Any) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        model = payload.get("model", "fake-model")
        chat = request.path == "/v1/chat/completions"
        try:
            for i in range(self.stream_events):
                gate = self.gates.get(i)
                if gate is not None:
                    await gate.wait()
                choice: dict[str, Any] = (
                    {"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}
                    if chat
                    else {"index": 0, "text": f"tok{i} ", "finish_reason": None}
                )
                event = {
                    "id": "chatcmpl-s" if chat else "cmpl-s",
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [choice],
                }
                await resp.write(f"data: {json.dumps(event)}\n\n".encode())
                self.sent.setdefault(i, asyncio.Event()).set()
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self.stream_cancelled.set()
            raise
        self.stream_finished.set()
        return resp


async def start_backends(n: int, ports: tuple[int, ...] | None = None) -> list[FakeBackend]:
    """Start ``n`` backends on free ports (or the given ports)."""
    ports = ports or (0,) * n
    return [await FakeBackend(port=p).start() for p in ports]
