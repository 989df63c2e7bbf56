"""What each router of ``sessionroute bench chaos`` thought of each worker, over time.

Every ``period_s`` the watcher reads each router's ``/metrics``
(``sessionroute_worker_available`` and ``sessionroute_circuit_state`` per worker) and keeps,
per (router, worker), the intervals during which the router held the worker unavailable, with
the reason: ``circuit open`` (its circuit breaker open or half-open) or ``health checks``. Two
routers judge workers on their own (health checks and circuit breakers are not shared), so a
worker one of them holds unavailable while the other does not explains a session the first
one moves off it. A router that does not answer (restarting) contributes no sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import aiohttp

__all__ = ["Unavailable", "watch"]

Unavailable = dict[tuple[int, str], list[list[Any]]]
"""(router index, worker URL) -> ``[start_s, end_s, reason]`` intervals, seconds since t0."""

_AVAILABLE = "sessionroute_worker_available{"
_CIRCUIT = "sessionroute_circuit_state{"


def _parse(text: str) -> dict[str, tuple[bool, int]]:
    """worker URL -> (available, circuit state) from a Prometheus text page."""
    seen: dict[str, list[float]] = {}
    for line in text.splitlines():
        for i, prefix in enumerate((_AVAILABLE, _CIRCUIT)):
            if line.startswith(prefix):
                label, _, value = line[len(prefix) :].partition("} ")
                url = label.partition('"')[2].rpartition('"')[0]
                seen.setdefault(url, [1.0, 0.0])[i] = float(value)
    return {url: (v[0] >= 1.0, int(v[1])) for url, v in seen.items()}


async def watch(routers: list[str], t0: float, out: Unavailable, period_s: float = 0.5) -> None:
    """Sample until cancelled, extending ``out`` (module docstring)."""
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while True:
            for r, url in enumerate(routers):
                with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                    async with http.get(url + "/metrics") as resp:
                        text = await resp.text()
                    now = time.monotonic() - t0
                    for worker, (available, circuit) in _parse(text).items():
                        if available:
                            continue
                        reason = "circuit open" if circuit else "health checks"
                        spans = out.setdefault((r, worker), [])
                        if spans and spans[-1][2] == reason and now - spans[-1][1] <= 2 * period_s:
                            spans[-1][1] = now
                        else:
                            spans.append([now, now, reason])
            await asyncio.sleep(period_s)
