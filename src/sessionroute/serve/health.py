"""Active health checks over HTTP, when the router core's timers ask for them.

The core decides when (:class:`~sessionroute.router.actions.CheckHealth`: a round of every
worker every ``health_check_interval_s``, the unhealthy ones every
``health_recheck_interval_s`` between rounds); this module only probes, and the verdicts are
folded into each worker's :class:`~sessionroute.router.health.WorkerHealth` by the core, which
also holds its circuit breaker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import aiohttp

from sessionroute.router.health import WorkerHealth

__all__ = ["HealthChecker", "probe"]

log = logging.getLogger("sessionroute.serve")


async def probe(
    session: aiohttp.ClientSession, url: str, timeout_s: float, headers: dict[str, str]
) -> tuple[bool, str]:
    """GET ``url`` once; ``(True, "")`` on a 2xx answer within ``timeout_s`` seconds."""
    try:
        async with session.get(
            url, timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers
        ) as resp:
            await resp.read()
            if 200 <= resp.status < 300:
                return True, ""
            return False, f"status {resp.status}"
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return False, f"{type(exc).__name__}: {exc}"


class HealthChecker:
    """Probes workers when asked (:meth:`check_once`).

    Args:
        session: the router's pooled client session.
        workers: the router's url -> :class:`WorkerHealth` map (read at each round).
        endpoint: path to GET on each worker.
        timeout_s: per-check timeout in seconds.
        observe: folds one check result of a worker into its health record and returns
            whether its verdict changed (through the router core's
            :meth:`~sessionroute.router.core.RoutingCore.observe_check`, which applies the
            failure and success thresholds).
        headers: headers sent with each check (the worker API key, if any).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        workers: dict[str, WorkerHealth],
        *,
        endpoint: str,
        timeout_s: float,
        observe: Callable[[str, bool], bool],
        headers: dict[str, str],
    ) -> None:
        self._session = session
        self._workers = workers
        self._endpoint = endpoint
        self._timeout = timeout_s
        self._observe = observe
        self._headers = headers
        self.rounds = 0
        self.round_done = asyncio.Event()

    async def check_once(self, urls: Iterable[str] | None = None) -> None:
        """Check every worker (or those of ``urls``) concurrently and apply the results; only
        a check of every worker counts as a round (:attr:`rounds`, :attr:`round_done`)."""
        full = urls is None
        if urls is None:
            items = list(self._workers.items())
        else:
            items = [(u, self._workers[u]) for u in urls if u in self._workers]
        results = await asyncio.gather(
            *(
                probe(self._session, url.rstrip("/") + self._endpoint, self._timeout, self._headers)
                for url, _ in items
            )
        )
        for (url, wh), (ok, reason) in zip(items, results, strict=True):
            if self._workers.get(url) is not wh:
                continue  # removed (or replaced) while the check ran
            if not ok:
                wh.last_error = reason
            if self._observe(url, ok):
                log.log(
                    logging.INFO if ok else logging.WARNING,
                    "worker %s is now %s",
                    url,
                    "healthy" if ok else "unhealthy",
                )
        if full:
            self.rounds += 1
            self.round_done.set()
            self.round_done = asyncio.Event()
