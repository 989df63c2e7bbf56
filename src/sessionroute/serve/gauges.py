"""Engine gauges scraped from every worker's ``/metrics`` into the router core's cluster view.

What the simulator's :class:`sessionroute.sim.sampling.Scraper` does in virtual time, done over
HTTP: every ``RouterConfig.scrape_interval_s`` seconds each worker's Prometheus text is read and
vLLM's ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and
``vllm:kv_cache_usage_perc`` (a fraction in [0, 1] despite its name; vLLM V1,
``vllm/v1/metrics/loggers.py``) become its :class:`~sessionroute.types.EngineGauges`, summed
over label sets (several engines behind one server). A worker that does not answer, or lacks
these gauges, keeps its last gauges (None until a scrape succeeds).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sessionroute.router.core import RoutingCore
from sessionroute.serve.usage import PREFIX_CACHE_COUNTERS, prefix_cache_counters
from sessionroute.types import EngineGauges

__all__ = ["GaugeScraper", "parse_gauges", "parse_page"]

log = logging.getLogger("sessionroute.serve")

_NAMES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
}


def parse_gauges(text: str) -> EngineGauges | None:
    """The engine gauges in a vLLM ``/metrics`` page, or None when it has none of them.

    Raises:
        ValueError: the text is not Prometheus exposition format.
    """
    return parse_page(text)[0]


def parse_page(text: str) -> tuple[EngineGauges | None, tuple[float, float] | None]:
    """The engine gauges and the prefix-cache counters (queries, hits in tokens;
    :mod:`sessionroute.serve.usage`) of a vLLM ``/metrics`` page, each None when absent.

    Raises:
        ValueError: the text is not Prometheus exposition format.
    """
    values: dict[str, float] = {}
    counters: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        counter = PREFIX_CACHE_COUNTERS.get(family.name.removesuffix("_total"))
        if counter is not None:
            counters[counter] = counters.get(counter, 0.0) + sum(
                s.value for s in family.samples if s.name.endswith("_total")
            )
            continue
        field = _NAMES.get(family.name)
        if field is None:
            continue
        values[field] = values.get(field, 0.0) + sum(s.value for s in family.samples)
    prefix = prefix_cache_counters(counters)
    if not values:
        return None, prefix
    return EngineGauges(
        running=int(values.get("running", 0.0)),
        waiting=int(values.get("waiting", 0.0)),
        kv_usage=min(1.0, max(0.0, values.get("kv_usage", 0.0))),
    ), prefix


class GaugeScraper:
    """Scrapes every worker of ``core`` every ``interval_s`` seconds until cancelled.

    Args:
        session: the router's pooled client session.
        core: the router core (its cluster receives the gauges).
        interval_s: seconds between rounds.
        timeout_s: per-scrape timeout in seconds.
        headers: headers sent with each scrape (the worker API key, if any).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        core: RoutingCore,
        *,
        interval_s: float,
        timeout_s: float,
        headers: dict[str, str],
    ) -> None:
        self._session = session
        self._core = core
        self._interval = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = headers
        self.rounds = 0
        self.prefix_cache: dict[str, tuple[float, float]] = {}
        """Worker -> its prefix-cache (queries, hits) counters in tokens, as last scraped."""

    async def scrape_once(self) -> None:
        """Scrape every worker concurrently and push what was read."""
        urls = self._core.cluster.workers()
        pages = await asyncio.gather(*(self._fetch(url) for url in urls))
        for url, text in zip(urls, pages, strict=True):
            if text is None:
                continue
            try:
                gauges, prefix = parse_page(text)
            except ValueError as exc:
                log.debug("worker %s: unreadable /metrics: %s", url, exc)
                continue
            if prefix is not None:
                self.prefix_cache[url] = prefix
            if gauges is not None:
                self._core.observe_gauges(url, gauges)
        self.rounds += 1

    async def _fetch(self, url: str) -> str | None:
        try:
            async with self._session.get(
                url.rstrip("/") + "/metrics", timeout=self._timeout, headers=self._headers
            ) as resp:
                if resp.status != 200:
                    return None
                return await resp.text()
        except (TimeoutError, aiohttp.ClientError, OSError, UnicodeDecodeError):
            return None

    async def run(self) -> None:
        """Scrape now and then every ``interval_s`` seconds, forever (cancel to stop)."""
        while True:
            await self.scrape_once()
            await asyncio.sleep(self._interval)
