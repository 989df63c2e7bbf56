"""serve scrapes every worker's engine gauges into the cluster view, as the simulator does."""

from __future__ import annotations

import asyncio

import pytest

from sessionroute.serve.gauges import parse_gauges
from sessionroute.types import EngineGauges

from .backend import FakeBackend
from .conftest import MakeRouter

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.625
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 1234.0
"""


def test_vllm_gauges_are_summed_over_engines() -> None:
    assert parse_gauges(VLLM_METRICS) == EngineGauges(running=5, waiting=4, kv_usage=0.625)
    assert parse_gauges("# nothing here\nother_metric 1.0\n") is None
    with pytest.raises(ValueError):
        parse_gauges("vllm:num_requests_running{ 3\n")


async def test_serve_scrapes_worker_gauges_into_the_cluster(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    backends[0].metrics_text = VLLM_METRICS  # backends[1] has no /metrics: gauges stay None
    router = await make_router([b.url for b in backends[:2]], scrape_interval_secs=0.02)
    scraper = router.router.gauges
    assert scraper is not None
    while scraper.rounds < 2:
        await asyncio.sleep(0.01)
    cluster = router.router.core.cluster
    assert cluster.gauges(backends[0].url) == EngineGauges(5, 4, 0.625)
    assert cluster.gauges(backends[1].url) is None
    backends[0].metrics_text = VLLM_METRICS.replace("} 3.0", "} 0.0")
    seen = scraper.rounds
    while scraper.rounds < seen + 2:
        await asyncio.sleep(0.01)
    assert cluster.gauges(backends[0].url) == EngineGauges(2, 4, 0.625)


async def test_zero_disables_scraping(backends: list[FakeBackend], make_router: MakeRouter) -> None:
    router = await make_router([backends[0].url], scrape_interval_secs=0)
    assert router.router.gauges is None and router.router.core.config.scrape_interval_s is None
