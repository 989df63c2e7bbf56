"""The zero-delay backend and the request body of the proxy benchmarks.

``sessionroute bench proxy`` and ``sessionroute bench instructions proxy`` run
:func:`backend_main` as their own process (a minimal aiohttp server: read the body, answer a
fixed one-token chat completion at once) and send it :func:`chat_body` requests.
"""

from __future__ import annotations

import asyncio
import json
import socket

__all__ = ["backend_main", "chat_body", "free_port"]

_RESPONSE = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


def backend_main(port: int, *more_ports: int) -> None:
    """Run the zero-delay backend on 127.0.0.1:``port`` (reads the body, answers at once),
    and on each of ``more_ports`` (one server, one process: many light workers)."""
    from aiohttp import web

    async def handle(request: web.BaseRequest) -> web.Response:
        await request.read()
        if request.method == "GET":
            return web.Response(text="")
        return web.Response(body=_RESPONSE, content_type="application/json")

    async def main() -> None:
        server = web.Server(handle, access_log=None)
        runner = web.ServerRunner(server)
        await runner.setup()
        for p in (port, *more_ports):
            await web.TCPSite(runner, "127.0.0.1", p, backlog=1024).start()
        await asyncio.Event().wait()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:  # pragma: no cover
        asyncio.run(main())


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chat_body(prompt_bytes: int) -> bytes:
    """A chat completion request body (1 output token) with a ``prompt_bytes`` message (0:
    a small one)."""
    content = "hello" if prompt_bytes <= 0 else "x" * prompt_bytes
    return json.dumps(
        {"model": "bench", "messages": [{"role": "user", "content": content}], "max_tokens": 1}
    ).encode()
