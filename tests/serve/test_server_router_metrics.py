"""Router-side metrics: streamed answers' TTFT and inter-token gaps, admission waits (histogram,
header, decisions after a wait, cap) and policy holds, over HTTP with real backends."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sessionroute.clock import Clock, MonotonicClock
from sessionroute.router.policies.base import Policy, least_loaded_of, require_healthy
from sessionroute.router.state import ClusterView
from sessionroute.serve import RunningRouter
from sessionroute.types import Decision, DecisionKind, RouteRequest

from .backend import FakeBackend
from .conftest import MakeRouter, chat, post_chat


class OneAtATime(Policy):
    """Least loaded, admitting a request only while none is in flight."""

    name: ClassVar[str] = "one_at_a_time"

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)

    def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
        return not any(cluster.in_flight(w) for w in cluster.healthy())

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        worker = least_loaded_of(require_healthy(cluster), cluster, request.request_id or "")
        return Decision(worker, DecisionKind.STATELESS)


async def _samples(client: aiohttp.ClientSession, router: RunningRouter) -> dict[str, float]:
    """``name{labels}`` -> value of every sample in ``/metrics`` (labels sorted by name)."""
    async with client.get(router.url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


async def test_streamed_answers_feed_ttft_and_inter_token_histograms_per_worker(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    router = await make_router([b.url], policy="round_robin")
    gates = {i: asyncio.Event() for i in range(3)}
    b.gates = gates
    async with client.post(router.url + "/v1/chat/completions", json=chat(stream=True)) as r:
        assert r.status == 200
        for i in range(3):  # each event reaches the client before the next is sent
            gates[i].set()
            line = await r.content.readuntil(b"\n\n")
            assert f"tok{i}".encode() in line
        await r.read()
    assert (await post_chat(client, router, None))[0] == 200  # not streamed: not timed
    m = await _samples(client, router)
    w = f'worker="{b.url}"'
    assert m[f"sessionroute_time_to_first_token_seconds_count{{{w}}}"] == 1
    assert m[f"sessionroute_time_to_first_token_seconds_sum{{{w}}}"] > 0
    assert m[f'sessionroute_time_to_first_token_seconds_bucket{{le="+Inf",{w}}}'] == 1
    # three gated events, then [DONE] and the last chunk: at least two gaps after the first
    assert m[f"sessionroute_inter_token_latency_seconds_count{{{w}}}"] >= 2


async def test_a_request_that_waited_says_how_long_and_is_counted(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router(
        [backends[0].url],
        clock=MonotonicClock(),  # waits are measured on the router's clock
        policy=f"{__name__}:OneAtATime",
        admission_max_wait_secs=30.0,
    )
    core = router.router.core
    hold = asyncio.Event()
    backends[0].hold = hold

    async def post() -> tuple[int, str | None]:
        async with client.post(router.url + "/v1/chat/completions", json=chat()) as r:
            await r.read()
            return r.status, r.headers.get("x-sessionroute-wait-ms")

    first = asyncio.create_task(post())
    while len(backends[0].seen) < 1:
        await asyncio.sleep(0.002)
    second = asyncio.create_task(post())
    while len(core.admission) < 1:
        await asyncio.sleep(0.002)
    hold.set()
    (s1, wait1), (s2, wait2) = await first, await second
    assert s1 == s2 == 200
    assert wait1 is None  # placed at once: no header
    assert wait2 is not None and float(wait2) > 0
    m = await _samples(client, router)
    assert m['sessionroute_admission_queue_wait_seconds_count{outcome="placed"}'] == 1
    assert m['sessionroute_admission_queue_wait_seconds_sum{outcome="placed"}'] > 0
    assert m['sessionroute_admission_queue_wait_seconds_count{outcome="refused"}'] == 0
    assert m['sessionroute_decisions_after_wait_total{kind="stateless"}'] == 1
    assert m['sessionroute_decisions_total{kind="stateless"}'] == 2
    assert m["sessionroute_admission_wait_cap_seconds{}"] == 30.0


async def test_hold_metrics_come_from_a_policy_that_reports_holds(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    held = await make_router([b.url for b in backends], policy="adaptive_hold")
    plain = await make_router([b.url for b in backends], policy="least_loaded")
    assert (await post_chat(client, held, "s"))[0] == 200
    m = await _samples(client, held)
    assert m["sessionroute_session_holds_total{}"] == 0
    assert m["sessionroute_held_turns_total{}"] == 0
    assert m["sessionroute_held_sessions{}"] == 0
    assert m['sessionroute_decisions_total{kind="new"}'] == 1
    names = {k.split("{")[0] for k in await _samples(client, plain)}
    assert "sessionroute_held_sessions" not in names
    assert "sessionroute_admission_queue_wait_seconds_count" in names


async def test_every_exported_metric_is_in_the_reference_table(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends], policy="adaptive_hold")
    body = chat(stream=True)
    async with client.post(router.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200 and b"[DONE]" in await r.read()
    async with client.get(router.url + "/metrics") as r:
        text = await r.text()
    doc = (Path(__file__).parents[2] / "docs" / "router.md").read_text()
    table = doc[doc.index("## Metrics") : doc.index("## Receipts and backpressure")]
    names = []
    for family in text_string_to_metric_families(text):
        name = family.name.removeprefix("sessionroute_")
        names.append(name + "_total" if family.type == "counter" else name)
    assert "time_to_first_token_seconds" in names and "held_sessions" in names
    assert [n for n in names if f"`{n}`" not in table] == []
    assert "`x-sessionroute-wait-ms" in table
