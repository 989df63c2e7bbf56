"""Differential test: the same session sequence through vllm-router and through ours.

Needs the ``vllm-router`` binary (PyPI ``vllm-router``, in the dev extra); skipped with a reason
when it is absent. Both routers front the same three fake backends on 127.0.0.1:18001..18003
(placements depend on the exact URL strings).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from .backend import FakeBackend, start_backends
from .conftest import MakeRouter

PORTS = (18001, 18002, 18003)


def _vllm_router() -> str | None:
    local = Path(sys.executable).parent / "vllm-router"
    if local.exists():
        return str(local)
    return shutil.which("vllm-router")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _drive(client: aiohttp.ClientSession, url: str, backends: list[FakeBackend]) -> list[str]:
    """30 new sessions, a second turn each, release sess-0, then sess-30 and sess-31."""
    for b in backends:
        b.seen.clear()
    order: list[str] = []
    ids = [f"sess-{i}" for i in range(30)]
    for sid in [*ids, *ids]:
        async with client.post(
            url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": sid}]},
            headers={"x-session-id": sid},
        ) as r:
            assert r.status == 200, await r.text()
            order.append(str((await r.json())["choices"][0]["message"]["content"]))
    async with client.post(url + "/finish_session", params={"session_id": "sess-0"}) as r:
        assert r.status == 200
    for sid in ("sess-30", "sess-31", "sess-0"):
        async with client.post(
            url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": sid}]},
            headers={"x-session-id": sid},
        ) as r:
            order.append(str((await r.json())["choices"][0]["message"]["content"]))
    return order


@pytest.mark.parametrize("policy", ["consistent_hash", "sticky_least_loaded"])
async def test_same_placements_as_vllm_router(
    policy: str, make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    binary = _vllm_router()
    if binary is None:
        pytest.skip("vllm-router is not installed (pip install vllm-router==0.1.17)")
    backends = await start_backends(3, PORTS)
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        binary, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
        "--worker-urls", *[b.url for b in backends], "--log-level", "warning",
        "--prometheus-port", str(_free_port()),  # its default 29000 may be taken
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "RUST_LOG": "warn"},
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):  # vllm-router checks its workers before it listens
            try:
                async with client.get(url + "/liveness") as r:
                    if r.status == 200:
                        break
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
        else:
            pytest.fail("vllm-router did not start within 30 s")
        theirs = await _drive(client, url, backends)
        ours_router = await make_router([b.url for b in backends], policy=policy)
        ours = await _drive(client, ours_router.url, backends)
        assert len(ours) == 63
        assert ours == theirs
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.wait(), 20)
        for b in backends:
            await b.kill()
