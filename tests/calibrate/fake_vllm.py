"""Loopback HTTP servers for calibrate's tests: a minimal vLLM look-alike and a plain server.

Each runs an aiohttp application on its own event loop in a thread, so that the code under
test (which runs ``asyncio.run`` itself, like the CLI) talks to it over real sockets.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class FakeVllm:
    """State of the vLLM look-alike: what it was asked, and its counters.

    It answers ``/metrics`` (``vllm:cache_config_info``, the request histograms' sums and
    counts, one engine step per token), ``/v1/models``, ``/server_info``, ``/version``,
    ``/tokenize``, ``/reset_prefix_cache`` and ``/v1/completions`` (streaming: one event per
    token, usage last; every prompt token cached after its first block once seen). Several
    look-alikes may share ``log``: each cache reset appends ``"<name> /reset_prefix_cache"``,
    in the order the servers received them.
    """

    block_size: int = 16
    num_gpu_blocks: int = 512
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 512
    max_model_len: int = 1024
    expose_limits: bool = True
    token_delay_s: float = 0.0  # between streamed tokens
    # hold each streamed reply and send its tokens at once (a vLLM frontend short of CPU), and
    # report the time the tokens took to make in vllm:request_decode_time_seconds
    burst: bool = False
    decode_sum_s: float = 0.0
    posts: list[str] = field(default_factory=list)
    log: list[str] | None = None
    name: str = "fake"
    requests: int = 0
    steps: int = 0
    seen: set[tuple[int, ...]] = field(default_factory=set)

    def metrics(self) -> str:
        lbl = '{engine="0",model_name="fake"}'
        hist = [
            "vllm:time_to_first_token_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:e2e_request_latency_seconds",
            "vllm:request_queue_time_seconds",
            "vllm:request_prefill_time_seconds",
            "vllm:request_decode_time_seconds",
        ]
        lines = [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{self.block_size}",engine="0",'
            f'num_gpu_blocks="{self.num_gpu_blocks}"}} 1.0',
        ]
        for h in [*hist, "vllm:iteration_tokens_total"]:
            count = self.steps if h == "vllm:iteration_tokens_total" else self.requests
            lines += [
                f"# HELP {h} x",
                f"# TYPE {h} histogram",
                f'{h}_bucket{{engine="0",le="+Inf",model_name="fake"}} {float(count)}',
                f"{h}_count{lbl} {float(count)}",
                f"{h}_sum{lbl} {self._sum(h, count)}",
            ]
        return "\n".join(lines) + "\n"

    def _sum(self, histogram: str, count: int) -> float:
        if self.burst and histogram == "vllm:request_decode_time_seconds":
            return self.decode_sum_s
        return 0.001 * count

    def app(self) -> web.Application:
        app = web.Application()

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=self.metrics())

        async def models(_: web.Request) -> web.Response:
            return web.json_response(
                {"data": [{"id": "fake", "max_model_len": self.max_model_len}]}
            )

        async def server_info(_: web.Request) -> web.Response:
            if not self.expose_limits:
                raise web.HTTPNotFound()
            sched = {
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
            }
            return web.json_response({"vllm_config": {"scheduler_config": sched}})

        async def version(_: web.Request) -> web.Response:
            return web.json_response({"version": "0.0-fake"})

        async def tokenize(req: web.Request) -> web.Response:
            self.posts.append("/tokenize")
            body = await req.json()
            return web.json_response(
                {
                    "tokens": [
                        100 + len(w) % 50 + i % 7 for i, w in enumerate(str(body["prompt"]).split())
                    ]
                }
            )

        async def reset(_: web.Request) -> web.Response:
            self.posts.append("/reset_prefix_cache")
            if self.log is not None:
                self.log.append(f"{self.name} /reset_prefix_cache")
            self.seen.clear()
            return web.json_response({"success": True})

        async def completions(req: web.Request) -> web.StreamResponse:
            self.posts.append("/v1/completions")
            body: dict[str, Any] = await req.json()
            prompt = list(body["prompt"])
            n = int(body["max_tokens"])
            head = tuple(prompt[: self.block_size])
            cached = (
                (len(prompt) - 1) // self.block_size * self.block_size if head in self.seen else 0
            )
            self.seen.add(head)
            usage = {
                "prompt_tokens": len(prompt),
                "completion_tokens": n,
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            if not body.get("stream"):
                self.steps += n
                self.requests += 1
                return web.json_response({"choices": [{"text": "x" * n}], "usage": usage})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(req)
            held: list[bytes] = []
            first = 0.0
            for i in range(n):
                self.steps += 1
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                chunk = {"choices": [{"index": 0, "text": "x"}]}
                event = f"data: {json.dumps(chunk)}\n\n".encode()
                if not self.burst:
                    await resp.write(event)
                    continue
                held.append(event)
                first = first or time.perf_counter()
                if i == n - 1:
                    self.decode_sum_s += time.perf_counter() - first
                    await resp.write(b"".join(held))
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            self.requests += 1
            return resp

        app.router.add_get("/metrics", metrics)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/server_info", server_info)
        app.router.add_get("/version", version)
        app.router.add_post("/tokenize", tokenize)
        app.router.add_post("/reset_prefix_cache", reset)
        app.router.add_post("/v1/completions", completions)
        return app


@contextmanager
def serving(app: web.Application) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) in a thread; yields its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    started = threading.Event()
    url: list[str] = []

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def start() -> None:
            await runner.setup()
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            await web.SockSite(runner, sock).start()
            url.append(f"http://127.0.0.1:{sock.getsockname()[1]}")
            started.set()

        loop.run_until_complete(start())
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("loopback server did not start")
    try:
        yield url[0]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
