"""Scraping, cache resets, template probing and taps against real in-process emulators."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from sessionroute.emulate import EmulatorHandle, EmulatorSettings, start_emulators, stop_all
from sessionroute.experiments.live.scrape import (
    parse_metrics,
    probe_overhead,
    reset_prefix_caches,
    scrape_all,
    served_model_info,
    server_latency_means,
)
from sessionroute.experiments.live.tap import start_taps

WORDS = " ".join(f"w{i}" for i in range(200))


@pytest.fixture
async def emus() -> AsyncIterator[list[EmulatorHandle]]:
    hs = await start_emulators(2, EmulatorSettings(port=0, time_scale=100))
    yield hs
    await stop_all(hs)


async def _chat(client: httpx.AsyncClient, url: str, sid: str, stream: bool = False) -> str:
    body = {
        "messages": [{"role": "user", "content": WORDS}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": stream,
    }
    r = await client.post(url + "/v1/chat/completions", json=body, headers={"x-session-id": sid})
    assert r.status_code == 200
    return r.text


async def test_counters_and_gauges_from_emulator_metrics(emus: list[EmulatorHandle]) -> None:
    url = emus[0].url
    async with httpx.AsyncClient() as client:
        before = (await scrape_all(client, [url]))[0]
        await _chat(client, url, "a")
        await _chat(client, url, "a")
        after = (await scrape_all(client, [url]))[0]
    d = after.delta(before)
    assert d["requests"] == 2
    assert d["generation_tokens"] == 16
    assert d["prefix_cache_queries"] == 2 * 206  # 200 words + 6 template tokens
    assert d["prefix_cache_hits"] == 192  # the second prompt hits 12 full blocks of 16
    assert after.gauges["running"] == 0
    assert "kv_usage" in after.gauges
    means = server_latency_means([before], [after])
    assert means["ttft_mean_s"] is not None and means["ttft_mean_s"] > 0
    assert means["itl_mean_s"] is not None and means["itl_mean_s"] > 0
    # where the time went inside the server: the emulator exports the queue and end-to-end
    # histograms, not vLLM's prefill and decode ones
    assert means["e2e_mean_s"] is not None and means["e2e_mean_s"] >= means["ttft_mean_s"]
    assert means["queue_mean_s"] is not None and means["queue_mean_s"] >= 0
    assert means["prefill_mean_s"] is None and means["decode_mean_s"] is None
    assert set(server_latency_means([after], [after]).values()) == {None}


def test_parse_metrics_sums_label_sets() -> None:
    text = (
        "# TYPE vllm:request_success counter\n"
        'vllm:request_success_total{finished_reason="length"} 3.0\n'
        'vllm:request_success_total{finished_reason="stop"} 2.0\n'
        'vllm:num_requests_running{engine="0"} 4.0\n'
        'vllm:gpu_cache_usage_perc{engine="0"} 0.5\n'
    )
    snap = parse_metrics(text)
    assert snap.counters == {"requests": 5.0}
    hist = (
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 3.0\n'
        'vllm:time_to_first_token_seconds_sum{engine="0"} 0.25\n'
        'vllm:time_to_first_token_seconds_count{engine="0"} 4.0\n'
    )
    assert parse_metrics(hist).counters == {"ttft_sum_s": 0.25, "ttft_count": 4.0}
    assert snap.gauges == {"running": 4.0, "kv_usage": 0.5}


async def test_reset_probe_and_model_info(emus: list[EmulatorHandle]) -> None:
    urls = [h.url for h in emus]
    async with httpx.AsyncClient() as client:
        await _chat(client, urls[0], "a")
        assert await reset_prefix_caches(client, [*urls, "http://127.0.0.1:9"]) == [
            True,
            True,
            False,
        ]
        before = (await scrape_all(client, urls[:1]))[0]
        await _chat(client, urls[0], "a")
        after = (await scrape_all(client, urls[:1]))[0]
        assert after.delta(before)["prefix_cache_hits"] == 0  # the reset dropped the blocks
        model, limit = await served_model_info(client, urls[0])
        assert model == "toy-8b-h100-tp1"
        assert limit is not None and limit > 1000
        over = await probe_overhead(client, urls[0], model)
        assert (over.first, over.per_turn) == (6, 8)
        dead = await probe_overhead(client, "http://127.0.0.1:9", model)
        assert (dead.first, dead.per_turn) == (0, 0)
        failed = (await scrape_all(client, ["http://127.0.0.1:9"]))[0]
        assert not failed.ok


async def test_taps_record_sessions_and_relay_streams(emus: list[EmulatorHandle]) -> None:
    taps, last = await start_taps([h.url for h in emus], "x-session-id")
    try:
        async with httpx.AsyncClient() as client:
            await _chat(client, taps[0].url, "s1")
            await _chat(client, taps[1].url, "s2")
            streamed = await _chat(client, taps[1].url, "s1", stream=True)
            r = await client.get(taps[0].url + "/health")
            assert r.status_code == 200
        assert "data: [DONE]" in streamed
        assert dict(taps[0].record.sessions) == {"s1": 1}
        assert dict(taps[1].record.sessions) == {"s2": 1, "s1": 1}
        assert taps[0].record.requests == 1  # /health is not a generation request
        assert last == {"s1": 1, "s2": 1}
    finally:
        for t in taps:
            await t.stop()
