"""``adaptive_sticky`` through the real router over HTTP: spread, escape and admission."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import aiohttp

from sessionroute.clock import MonotonicClock
from sessionroute.router.policies.adaptive_sticky import AdaptiveStickyPolicy
from sessionroute.types import EngineGauges

from .backend import FakeBackend
from .conftest import MakeRouter, post_chat


def _vllm(waiting: int, kv: float) -> str:
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 50.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0"}} {kv}\n'
    )


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def _scraped(router: object, backends: list[FakeBackend], *expected: EngineGauges) -> None:
    """Wait until the router's cluster holds ``expected`` gauges for each backend."""
    cluster = router.router.core.cluster  # type: ignore[attr-defined]
    deadline = time.monotonic() + 5.0
    while [cluster.gauges(b.url) for b in backends] != list(expected):
        assert time.monotonic() < deadline, "gauges were not scraped in time"
        await asyncio.sleep(0.01)


async def test_serve_runs_adaptive_sticky_spread_escape_and_admission(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    cool, hot, knee = _vllm(0, 0.5), _vllm(10, 0.95), _vllm(3, 0.95)  # knee: KV in use
    for b in backends:
        b.metrics_text = cool
    router = await make_router(  # the held turn's deadline is the core's timer: a real clock
        [b.url for b in backends],
        clock=MonotonicClock(),
        policy="adaptive_sticky",
        scrape_interval_secs=0.02,
    )
    await _scraped(router, backends, *[EngineGauges(50, 0, 0.5)] * 3)
    # Six first turns of equal size: two per backend (token load, reserved at selection).
    for i in range(6):
        assert (await post_chat(client, router, f"s{i}"))[0] == 200
    assert sorted(len(b.seen) for b in backends) == [2, 2, 2]
    home = {s.session: b for b in backends for s in b.seen}
    # One backend turns hot: the next turn of one of its sessions escapes to another backend.
    src = backends[0]
    src.metrics_text = hot
    await _scraped(router, backends, EngineGauges(50, 10, 0.95), *[EngineGauges(50, 0, 0.5)] * 2)
    moved = next(s for s, b in home.items() if b is src)
    assert moved is not None
    assert (await post_chat(client, router, moved))[0] == 200
    assert len(src.seen) == 2  # the turn did not go to its (hot) home
    assert [b.seen[-1].session for b in backends[1:]].count(moved) == 1
    # Every backend past its knee. The knee is the projected working set over a capacity
    # learned from gauges while requests are in flight; a tiny knee_pressure (and a short
    # maximum wait) make one in-flight request per backend enough.
    policy = router.router.core.policy
    assert isinstance(policy, AdaptiveStickyPolicy)
    policy.cfg = dataclasses.replace(
        policy.cfg, knee_pressure=0.01, capacity_alpha=1.0, max_wait_s=0.3
    )
    hold = asyncio.Event()
    for b in backends:
        b.hold = hold
        b.metrics_text = knee
    await _scraped(router, backends, *[EngineGauges(50, 3, 0.95)] * 3)
    busy = [asyncio.create_task(post_chat(client, router, f"s{i}")) for i in range(6)]
    busy.append(asyncio.create_task(post_chat(client, router, "probe")))  # learns capacities
    await _until(lambda: sum(len(b.seen) for b in backends) == 14)  # in flight everywhere
    t0 = time.monotonic()
    late = asyncio.create_task(post_chat(client, router, "late"))
    await _until(lambda: len(router.router.core.admission) == 1)  # held at the router
    busy.append(asyncio.create_task(post_chat(client, router, "s1")))  # a running session
    await _until(lambda: sum(len(b.seen) for b in backends) == 15)  # s1 went ahead
    assert "late" not in {s.session for b in backends for s in b.seen}
    await _until(lambda: len(router.router.core.admission) == 0)  # placed at 0.3 s
    assert time.monotonic() - t0 >= 0.3
    hold.set()
    assert [(await t)[0] for t in busy] == [200] * 8
    assert (await late)[0] == 200
    async with client.get(router.url + "/metrics") as r:
        text = await r.text()
    assert 'sessionroute_decisions_total{kind="moved"} 1.0' in text
    assert 'sessionroute_admission_total{outcome="placed_at_deadline"} 1.0' in text
    assert 'sessionroute_admission_total{outcome="refused_timeout"} 0.0' in text
    assert "sessionroute_admission_waiting 0.0" in text
