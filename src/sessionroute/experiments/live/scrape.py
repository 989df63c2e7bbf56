"""Talking to replicas as vLLM servers: ``/metrics`` snapshots, ``/reset_prefix_cache``,
``/v1/models`` and the chat template's token overhead (``/tokenize``).

Metric names are vLLM V1's (``vllm/v1/metrics/loggers.py``); the emulator exports the same.
Counters are summed over their label sets (``model_name``, ``engine``, ``finished_reason``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sessionroute.experiments.live.text import TemplateOverhead

__all__ = [
    "COUNTERS",
    "MetricsSnapshot",
    "parse_metrics",
    "probe_overhead",
    "reset_prefix_caches",
    "scrape",
    "scrape_all",
    "served_model_info",
    "server_latency_means",
]

COUNTERS: dict[str, str] = {
    "prefix_cache_hits": "vllm:prefix_cache_hits",
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "preemptions": "vllm:num_preemptions",
    "prompt_tokens": "vllm:prompt_tokens",
    "generation_tokens": "vllm:generation_tokens",
    "requests": "vllm:request_success",
    "ttft_sum_s": "vllm:time_to_first_token_seconds_sum",
    "ttft_count": "vllm:time_to_first_token_seconds_count",
    "itl_sum_s": "vllm:inter_token_latency_seconds_sum",
    "itl_count": "vllm:inter_token_latency_seconds_count",
    "queue_sum_s": "vllm:request_queue_time_seconds_sum",
    "queue_count": "vllm:request_queue_time_seconds_count",
    "prefill_sum_s": "vllm:request_prefill_time_seconds_sum",
    "prefill_count": "vllm:request_prefill_time_seconds_count",
    "decode_sum_s": "vllm:request_decode_time_seconds_sum",
    "decode_count": "vllm:request_decode_time_seconds_count",
    "e2e_sum_s": "vllm:e2e_request_latency_seconds_sum",
    "e2e_count": "vllm:e2e_request_latency_seconds_count",
}
"""Our name -> the Prometheus family of a vLLM counter (tokens, or counts; ``*_sum_s`` and
``*_count``: a histogram's sum, seconds, and count)."""

_GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}


@dataclass(slots=True)
class MetricsSnapshot:
    """One replica's ``/metrics`` at one moment.

    Attributes:
        counters: our counter names (:data:`COUNTERS`) -> cumulative value; a counter the server
            does not export is absent.
        gauges: ``running``, ``waiting``, ``kv_usage`` (0..1) when exported.
        ok: False when the scrape failed (then both maps are empty).
    """

    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    ok: bool = True

    def delta(self, before: MetricsSnapshot) -> dict[str, float]:
        """Counter increases since ``before`` (only counters present in both)."""
        return {k: v - before.counters[k] for k, v in self.counters.items() if k in before.counters}


_WANTED = tuple(sorted({*COUNTERS.values(), *(n for ns in _GAUGES.values() for n in ns)}))


def _wanted_lines(text: str) -> str:
    """Only the sample lines of the families we read (a vLLM ``/metrics`` is mostly histogram
    buckets; parsing all of it at every scrape costs milliseconds)."""
    keep = [line for line in text.splitlines() if line.startswith(_WANTED)]
    return "\n".join(keep) + "\n"


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse Prometheus text into a :class:`MetricsSnapshot` (unknown families ignored)."""
    values: dict[str, float] = {}
    for fam in text_string_to_metric_families(_wanted_lines(text)):
        for s in fam.samples:
            values[s.name] = values.get(s.name, 0.0) + s.value
    snap = MetricsSnapshot()
    for ours, name in COUNTERS.items():
        for sample in (name + "_total", name):
            if sample in values:
                snap.counters[ours] = values[sample]
                break
    for ours, names in _GAUGES.items():
        for name in names:
            if name in values:
                snap.gauges[ours] = values[name]
                break
    return snap


_MEANS = ("ttft", "itl", "queue", "prefill", "decode", "e2e")
"""vLLM histograms averaged by :func:`server_latency_means` (``<name>_sum_s``/``<name>_count``
in :data:`COUNTERS`)."""


def server_latency_means(
    before: Sequence[MetricsSnapshot], after: Sequence[MetricsSnapshot]
) -> dict[str, float | None]:
    """vLLM's own means over every replica between two scrapes, seconds (None where no replica
    counted one): ``ttft_mean_s`` and ``itl_mean_s`` (against the client's, how much of what it
    measured is the servers'; the rest is HTTP, the router and the client), and where a
    request's time went inside the server: ``queue_mean_s`` (waiting to be scheduled),
    ``prefill_mean_s`` (first scheduled to first token), ``decode_mean_s`` (first to last
    token) and ``e2e_mean_s`` (arrival to finish)."""
    sums = {f"{n}_{k}": 0.0 for n in _MEANS for k in ("sum_s", "count")}
    for b, a in zip(before, after, strict=True):
        if a.ok and b.ok:
            d = a.delta(b)
            for k in sums:
                sums[k] += d.get(k, 0.0)
    return {
        f"{n}_mean_s": sums[f"{n}_sum_s"] / sums[f"{n}_count"] if sums[f"{n}_count"] else None
        for n in _MEANS
    }


async def scrape(client: httpx.AsyncClient, url: str) -> MetricsSnapshot:
    """``GET url/metrics`` parsed; a failed scrape gives ``ok=False``."""
    try:
        r = await client.get(url + "/metrics")
        r.raise_for_status()
        return parse_metrics(r.text)
    except (httpx.HTTPError, ValueError):
        return MetricsSnapshot(ok=False)


async def scrape_all(client: httpx.AsyncClient, urls: Sequence[str]) -> list[MetricsSnapshot]:
    """Scrape every replica concurrently."""
    return list(await asyncio.gather(*(scrape(client, u) for u in urls)))


async def reset_prefix_caches(client: httpx.AsyncClient, urls: Sequence[str]) -> list[bool]:
    """``POST /reset_prefix_cache`` on every replica; True where it answered 200.

    vLLM serves it only with ``VLLM_SERVER_DEV_MODE=1`` (the vllm-cpu preset sets it).
    """

    async def one(url: str) -> bool:
        try:
            r = await client.post(url + "/reset_prefix_cache")
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    return list(await asyncio.gather(*(one(u) for u in urls)))


async def served_model_info(client: httpx.AsyncClient, url: str) -> tuple[str, int | None]:
    """The first model of ``GET url/v1/models`` and its ``max_model_len`` (None if not said).

    Raises:
        httpx.HTTPError: the server did not answer. ValueError: it lists no model.
    """
    r = await client.get(url + "/v1/models")
    r.raise_for_status()
    data: list[Mapping[str, Any]] = r.json().get("data") or []
    if not data:
        raise ValueError(f"{url}/v1/models lists no model")
    first = data[0]
    mml = first.get("max_model_len")
    return str(first["id"]), int(mml) if isinstance(mml, int) else None


async def probe_overhead(client: httpx.AsyncClient, url: str, model: str) -> TemplateOverhead:
    """The chat template's extra tokens, from ``POST url/tokenize`` with empty messages.

    ``first`` = tokens of ``[user: ""]`` (with the generation prompt); ``per_turn`` = tokens of
    ``[user: "", assistant: "", user: ""]`` minus ``first``. Zeros when the server has no
    ``/tokenize``.
    """

    async def count(messages: list[dict[str, str]]) -> int | None:
        try:
            r = await client.post(
                url + "/tokenize",
                json={"model": model, "messages": messages, "add_generation_prompt": True},
            )
            if r.status_code != 200:
                return None
            return int(r.json()["count"])
        except (httpx.HTTPError, KeyError, ValueError, TypeError):
            return None

    u = {"role": "user", "content": ""}
    a = await count([u])
    b = await count([u, {"role": "assistant", "content": ""}, u])
    if a is None or b is None:
        return TemplateOverhead()
    return TemplateOverhead(first=max(0, a), per_turn=max(0, b - a))
