"""Router-side prefix-cache metrics per worker, from two sources.

* **The workers' ``/metrics``** (always, with the engine-gauge scrape every
  ``--scrape-interval-secs``): vLLM V1's counters ``vllm:prefix_cache_queries_total`` and
  ``vllm:prefix_cache_hits_total`` (tokens), exported as
  ``sessionroute_worker_prefix_cache_queries_tokens_total{worker}`` and
  ``sessionroute_worker_prefix_cache_hits_tokens_total{worker}`` (the worker's own counts, as
  last scraped);
* **the responses' ``usage``** (with ``--usage-metrics``): each complete JSON answer relayed
  whole is scanned for ``"prompt_tokens"`` and ``"cached_tokens"``
  (``usage.prompt_tokens_details.cached_tokens``, which vLLM fills with
  ``--enable-prompt-tokens-details``), exported as
  ``sessionroute_worker_prompt_tokens_total{worker}`` and
  ``sessionroute_worker_cached_prompt_tokens_total{worker}``. Streamed answers are not
  scanned.

The hit rate per worker is a PromQL ratio of the counters' rates, e.g.
``rate(sessionroute_worker_cached_prompt_tokens_total[5m]) /
rate(sessionroute_worker_prompt_tokens_total[5m])`` (Prometheus exports counters, not ratios).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, Metric

__all__ = ["PREFIX_CACHE_COUNTERS", "UsageCollector", "UsageMetrics", "prefix_cache_counters"]

PREFIX_CACHE_COUNTERS = {
    "vllm:prefix_cache_queries": "queries",
    "vllm:prefix_cache_hits": "hits",
}
"""vLLM's prefix-cache counter families (names without ``_total``, as the parser gives them)."""

_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')


def prefix_cache_counters(families: Mapping[str, float]) -> tuple[float, float] | None:
    """(queries, hits) from summed counter families by name, or None when absent."""
    if "queries" not in families:
        return None
    return families["queries"], families.get("hits", 0.0)


class UsageMetrics:
    """Prompt and cached-prompt tokens per worker, read from the responses' ``usage``."""

    def __init__(self) -> None:
        self.prompt_tokens: dict[str, int] = {}
        self.cached_tokens: dict[str, int] = {}

    def observe(self, worker: str, body: bytes) -> None:
        """Count the ``usage`` of one complete JSON answer of ``worker`` (no-op without)."""
        m = _PROMPT.search(body)
        if m is None:
            return
        self.prompt_tokens[worker] = self.prompt_tokens.get(worker, 0) + int(m.group(1))
        c = _CACHED.search(body)
        if c is not None:
            self.cached_tokens[worker] = self.cached_tokens.get(worker, 0) + int(c.group(1))


class UsageCollector:
    """Prometheus collector of both sources (module docstring).

    Args:
        usage: the responses' counts, or None without ``--usage-metrics``.
        prefix_cache: returns worker -> (queries, hits) as last scraped from ``/metrics``.
    """

    def __init__(
        self,
        usage: UsageMetrics | None,
        prefix_cache: Callable[[], Mapping[str, tuple[float, float]]],
    ) -> None:
        self._usage = usage
        self._prefix_cache = prefix_cache

    def collect(self) -> Iterator[Metric]:
        scraped = self._prefix_cache()
        queries = CounterMetricFamily(
            "sessionroute_worker_prefix_cache_queries_tokens",
            "Prompt tokens the worker looked up in its prefix cache (its vllm counter)",
            labels=["worker"],
        )
        hits = CounterMetricFamily(
            "sessionroute_worker_prefix_cache_hits_tokens",
            "Prompt tokens the worker found in its prefix cache (its vllm counter)",
            labels=["worker"],
        )
        for url, (q, h) in scraped.items():
            queries.add_metric([url], q)
            hits.add_metric([url], h)
        yield queries
        yield hits
        if self._usage is None:
            return
        prompt = CounterMetricFamily(
            "sessionroute_worker_prompt_tokens",
            "Prompt tokens in the usage of the worker's complete answers",
            labels=["worker"],
        )
        cached = CounterMetricFamily(
            "sessionroute_worker_cached_prompt_tokens",
            "Cached prompt tokens (usage.prompt_tokens_details.cached_tokens) in its answers",
            labels=["worker"],
        )
        for url, n in self._usage.prompt_tokens.items():
            prompt.add_metric([url], n)
            cached.add_metric([url], self._usage.cached_tokens.get(url, 0))
        yield prompt
        yield cached
