"""Shared helpers of the emulator tests (real servers on 127.0.0.1), plus their own checks."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sessionroute.emulate import EmulatorHandle, EmulatorSettings, emulators

MODEL = "toy-8b-h100-tp1"

FAST = EmulatorSettings(port=0, time_scale=1000.0, stream_interval_s=0.002)
"""Free ports, 1000 simulated seconds per wall second: a 16-token reply takes ~0.1 ms."""


@asynccontextmanager
async def running(n: int = 1, **overrides: Any) -> AsyncIterator[list[EmulatorHandle]]:
    """``n`` emulators with :data:`FAST` settings updated by ``overrides``."""
    async with emulators(n, dataclasses.replace(FAST, **overrides)) as handles:
        yield handles


def user(content: str) -> dict[str, str]:
    return {"role": "user", "content": content}


def words(n: int, tag: str) -> str:
    """``n`` distinct space-separated words (``n`` tokens after a non-space start)."""
    return " ".join(f"{tag}{i}" for i in range(n))


async def metrics(url: str) -> dict[str, float]:
    """Samples of ``url/metrics`` by sample name (labels dropped; one series per name)."""
    async with httpx.AsyncClient() as client:
        resp = await client.get(url + "/metrics")
    resp.raise_for_status()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            if "le" not in sample.labels:
                out[sample.name] = sample.value
    return out


async def until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait until ``cond()`` holds (checked every millisecond), else fail."""
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.001)


async def test_running_serves_health_and_metrics() -> None:
    async with running(2) as (a, b):
        assert a.port != b.port
        async with httpx.AsyncClient() as client:
            assert (await client.get(a.url + "/health")).status_code == 200
            assert (await client.get(b.url + "/ping")).status_code == 200
        m = await metrics(a.url)
        assert m["vllm:num_requests_running"] == 0.0
        assert m["vllm:prefix_cache_queries_total"] == 0.0
