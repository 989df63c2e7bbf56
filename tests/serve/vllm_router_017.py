"""vllm-router 0.1.17's command line and routes, checked in (the tests also read its
``--help`` when the binary is installed).

``FLAGS``: every option of ``vllm-router --help`` (0.1.17) with a sample value list.
``ROUTES``: (method, path, JSON body or None) of its HTTP routes, from its binary's route
table and by probing it in front of fake workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

FLAGS: dict[str, list[str]] = {
    "--host": ["127.0.0.1"],
    "--port": ["30001"],
    "--worker-urls": ["http://127.0.0.1:8000"],
    "--enable-program-scheduling": [],
    "--program-scheduling-config-json": ["{}"],
    "--policy": ["consistent_hash"],
    "--prefill-policy": ["cache_aware"],
    "--decode-policy": ["cache_aware"],
    "--router-temperature": ["0.5"],
    "--kv-penalty-host": ["0.8"],
    "--kv-penalty-external": ["0.6"],
    "--kv-penalty-disk": ["0.3"],
    "--kv-aware-session-affinity-ttl-secs": ["60"],
    "--kv-event-source": ["http://127.0.0.1:8000=tcp://127.0.0.1:5557"],
    "--kv-event-replay-source": ["http://127.0.0.1:8000=tcp://127.0.0.1:5558"],
    "--kv-event-block-size": ["16"],
    "--kv-event-model": ["m"],
    "--pd-kv-events": ["http://127.0.0.1:8000=tcp://127.0.0.1:5557"],
    "--mini-lb": [],
    "--vllm-pd-disaggregation": [],
    "--prefill": ["http://127.0.0.1:8000"],
    "--decode": ["http://127.0.0.1:8001"],
    "--worker-startup-timeout-secs": ["600"],
    "--worker-startup-check-interval": ["30"],
    "--cache-threshold": ["0.3"],
    "--balance-abs-threshold": ["64"],
    "--balance-rel-threshold": ["1.5"],
    "--eviction-interval-secs": ["120"],
    "--max-tree-size": ["33554432"],
    "--max-payload-size": ["536870912"],
    "--wasm-middleware": ["m.wasm"],
    "--wasm-middleware-sha256": ["0" * 64],
    "--wasm-middleware-route": ["/v1/chat/completions"],
    "--intra-node-data-parallel-size": ["1"],
    "--enable-igw": [],
    "--api-key": ["k"],
    "--log-dir": ["/tmp"],
    "--log-level": ["info"],
    "--service-discovery": [],
    "--selector": ["app=vllm"],
    "--service-discovery-port": ["80"],
    "--service-discovery-namespace": ["default"],
    "--prefill-selector": ["app=p"],
    "--decode-selector": ["app=d"],
    "--vllm-discovery-address": ["0.0.0.0:30001"],
    "--kv-connector": ["nixl"],
    "--prometheus-port": ["29000"],
    "--prometheus-host": ["127.0.0.1"],
    "--request-id-headers": ["x-request-id"],
    "--request-timeout-secs": ["1800"],
    "--retry-max-retries": ["5"],
    "--retry-initial-backoff-ms": ["50"],
    "--retry-max-backoff-ms": ["30000"],
    "--retry-backoff-multiplier": ["1.5"],
    "--retry-jitter-factor": ["0.2"],
    "--disable-retries": [],
    "--cb-failure-threshold": ["10"],
    "--cb-success-threshold": ["3"],
    "--cb-timeout-duration-secs": ["60"],
    "--cb-window-duration-secs": ["120"],
    "--disable-circuit-breaker": [],
    "--health-failure-threshold": ["3"],
    "--health-success-threshold": ["2"],
    "--health-check-timeout-secs": ["5"],
    "--health-check-interval-secs": ["60"],
    "--health-check-endpoint": ["/health"],
    "--max-concurrent-requests": ["32768"],
    "--queue-size": ["100"],
    "--queue-timeout-secs": ["60"],
    "--rate-limit-tokens-per-second": ["100"],
    "--cors-allowed-origins": ["http://localhost:3000"],
}

_CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}

ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/liveness", None),
    ("GET", "/readiness", None),
    ("GET", "/health", None),
    ("GET", "/health_generate", None),
    ("GET", "/get_server_info", None),
    ("GET", "/get_model_info", None),
    ("GET", "/v1/models", None),
    ("POST", "/generate", {"text": "hi"}),
    ("POST", "/v1/chat/completions", _CHAT),
    ("POST", "/v1/completions", {"model": "m", "prompt": "x"}),
    ("POST", "/v1/embeddings", {"model": "m", "input": "x"}),
    ("POST", "/v1/responses", {"model": "m", "input": "x"}),
    ("POST", "/rerank", {"query": "q", "documents": ["a"]}),
    ("POST", "/v1/rerank", {"query": "q", "documents": ["a"]}),
    ("GET", "/v1/responses/resp_1", None),
    ("POST", "/v1/responses/resp_1/cancel", None),
    ("GET", "/v1/responses/resp_1/input", None),
    ("POST", "/v1/chat/completions/render", _CHAT),
    ("POST", "/v1/completions/render", {"model": "m", "prompt": "x"}),
    ("POST", "/v1/responses/render", {"model": "m", "input": "x"}),
    ("POST", "/inference/v1/generate", {"text": "hi"}),
    ("GET", "/scheduling/diagnostics", None),
    ("POST", "/finish_session?session_id=s", None),
    ("GET", "/list_workers", None),
    ("GET", "/workers", None),
    ("GET", "/get_loads", None),
    ("POST", "/flush_cache", None),
    ("POST", "/add_worker?url=http://127.0.0.1:9", None),
    ("POST", "/remove_worker?url=http://127.0.0.1:9", None),
    ("GET", "/metrics", None),
]


def vllm_router_binary() -> str | None:
    """The installed ``vllm-router`` (next to this Python, else on PATH), or None."""
    local = Path(sys.executable).parent / "vllm-router"
    if local.exists():
        return str(local)
    return shutil.which("vllm-router")


def help_flags() -> list[str] | None:
    """The options ``vllm-router --help`` lists, or None when it is not installed."""
    binary = vllm_router_binary()
    if binary is None:
        return None
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60).stdout
    return sorted(set(re.findall(r"^  (--[a-z0-9-]+)", out, re.M)))


def free_port() -> int:
    """A free loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def running_vllm_router(
    client: aiohttp.ClientSession, workers: list[str], *args: str
) -> AsyncIterator[str]:
    """Start ``vllm-router`` in front of ``workers`` with ``args``; yields its base URL once
    it answers ``/liveness`` (it checks its workers before it listens), kills it (by its
    process) afterwards. Skips the test when it is not installed."""
    binary = vllm_router_binary()
    if binary is None:
        pytest.skip("vllm-router is not installed (pip install vllm-router==0.1.17)")
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        binary, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
        "--log-level", "warning", "--prometheus-port", str(free_port()), *args,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "RUST_LOG": "warn"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                async with client.get(url + "/liveness") as r:
                    if r.status == 200:
                        break
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
        else:
            pytest.fail("vllm-router did not start within 30 s")
        yield url
    finally:
        if proc.returncode is None:
            proc.kill()  # (SIGTERM left a renamed vllm::router process running once)
        await asyncio.wait_for(proc.wait(), 20)
