"""Route receipts (--route-receipts) and GET /backpressure (issue 40)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from sessionroute.clock import MonotonicClock

from .backend import FakeBackend
from .conftest import JSON, MakeRouter, chat

HEADER = "x-sessionroute-route"


async def _post(
    client: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str] | None = None,
    **body: Any,
) -> tuple[int, str | None]:
    async with client.post(
        url + "/v1/chat/completions", json=chat(**body), headers={**JSON, **(headers or {})}
    ) as r:
        await r.read()
        return r.status, r.headers.get(HEADER)


def _fields(header: str | None) -> dict[str, str]:
    assert header is not None
    return dict(part.split("=", 1) for part in header.split("; "))


async def test_no_receipts_by_default(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends])
    assert await _post(client, router.url, {"x-session-id": "a"}) == (200, None)
    assert router.router.core.on_decision is None and router.router.receipts is None


async def test_receipts_name_policy_worker_reason_origin_and_wait(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    log = tmp_path / "receipts.jsonl"
    router = await make_router(
        [b.url for b in backends], route_receipts=True, route_receipts_log=str(log)
    )
    urls = {b.url for b in backends}
    _, first = await _post(client, router.url, {"x-session-id": "s1"})
    _, second = await _post(client, router.url, {"x-session-id": "s1"})
    _, body_id = await _post(client, router.url, prompt_cache_key="k1")
    _, none = await _post(client, router.url)
    _, streamed = await _post(client, router.url, {"x-session-id": "s1"}, stream=True)
    f1, f2, fb, fn, fs = map(_fields, (first, second, body_id, none, streamed))
    assert f1["policy"] == "sticky_least_loaded" and f1["worker"] in urls
    assert (f1["reason"], f1["session"], f1["origin"]) == ("new", "s1", "x-session-id")
    assert (f2["reason"], f2["worker"]) == ("sticky", f1["worker"])
    assert (fb["reason"], fb["session"], fb["origin"]) == ("new", "k1", "body:prompt_cache_key")
    assert fn["reason"] == "stateless" and "session" not in fn
    assert (fs["reason"], fs["worker"]) == ("sticky", f1["worker"])  # the streamed relay too
    assert float(f1["wait_ms"]) == 0.0
    await router.stop()  # closes the log
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["reason"] for r in records] == ["new", "sticky", "new", "stateless", "sticky"]
    assert records[0]["status"] == 200 and records[0]["worker"] == f1["worker"]
    assert records[2]["origin"] == "body:prompt_cache_key"


async def test_a_queued_request_reports_its_wait_and_backpressure_says_saturated(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    router = await make_router(
        [b.url],
        clock=MonotonicClock(),  # the wait is measured on the router's clock
        route_receipts=True,
        max_concurrent_requests=1,
        rate_limit_tokens_per_second=0.001,
        queue_size=4,
    )
    async with client.get(router.url + "/backpressure") as r:
        idle = await r.json()
    assert idle["saturated"] is False and idle["workers"][0]["available"] is True
    b.hold = asyncio.Event()
    first = asyncio.create_task(_post(client, router.url, {"x-session-id": "q1"}))
    second = asyncio.create_task(_post(client, router.url, {"x-session-id": "q2"}))
    for _ in range(200):
        if router.router.core.admission.waiting:
            break
        await asyncio.sleep(0.005)
    async with client.get(router.url + "/backpressure") as r:
        busy = await r.json()
    assert busy["saturated"] is True
    assert {"router_queue", "rate_limit"} <= set(busy["reasons"])
    assert (busy["queued"], busy["in_flight"], busy["held_turns"]) == (1, 1, 0)
    assert busy["workers"][0]["sessions"] == 1
    b.hold.set()
    (_, h1), (_, h2) = await first, await second
    assert float(_fields(h1)["wait_ms"]) == 0.0
    assert float(_fields(h2)["wait_ms"]) > 0.0  # waited for the first one's token


async def test_usage_metrics_from_answers_and_prefix_cache_counters_from_workers(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    b.metrics_text = (
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{engine="0"} 1000.0\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{engine="0"} 750.0\n'
    )
    router = await make_router([b.url], usage_metrics=True, scrape_interval_secs=3600)
    assert router.router.gauges is not None
    await router.router.gauges.scrape_once()
    for _ in range(3):
        assert (await _post(client, router.url))[0] == 200
    text = router.router.metrics.render().decode()
    assert (
        f'sessionroute_worker_prefix_cache_queries_tokens_total{{worker="{b.url}"}} 1000.0' in text
    )
    assert f'sessionroute_worker_prefix_cache_hits_tokens_total{{worker="{b.url}"}} 750.0' in text
    # the fake worker's usage: prompt_tokens 1 per answer, no cached_tokens detail
    assert f'sessionroute_worker_prompt_tokens_total{{worker="{b.url}"}} 3.0' in text
    assert f'sessionroute_worker_cached_prompt_tokens_total{{worker="{b.url}"}} 0.0' in text


def test_usage_scan_reads_cached_tokens() -> None:
    from sessionroute.serve.usage import UsageMetrics

    u = UsageMetrics()
    u.observe(
        "w", b'{"usage": {"prompt_tokens": 120, "prompt_tokens_details": {"cached_tokens": 96}}}'
    )
    u.observe("w", b'{"usage": {"prompt_tokens": 30}}')
    u.observe("w", b"not json")
    assert (u.prompt_tokens, u.cached_tokens) == ({"w": 150}, {"w": 96})
