"""Admin and probe endpoints, metrics, auth, malformed and oversize bodies."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import aiohttp
import pytest

from sessionroute.clock import Clock
from sessionroute.router.policies import Policy, require_healthy
from sessionroute.router.requests import BYTES_PER_TOKEN, text_block_keys
from sessionroute.router.state import ClusterView
from sessionroute.types import Decision, DecisionKind, RouteRequest

from .backend import FakeBackend, start_backends
from .conftest import JSON, MakeRouter, chat, post_chat


class RecordingContentPolicy(Policy):
    """A user policy (loaded as ``module:Class``) that reads the prompt text."""

    name: ClassVar[str] = "recording"
    needs_content = True
    seen: ClassVar[list[tuple[list[int] | None, str | None]]] = []

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        blocks = None if request.blocks is None else list(request.blocks)
        RecordingContentPolicy.seen.append((blocks, request.model))
        return Decision(require_healthy(cluster)[0], DecisionKind.STATELESS)


async def test_finish_session_contract(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends], policy="sticky_least_loaded")
    weird = "a b/ç%&="
    await post_chat(client, router, weird)
    await post_chat(client, router, "plain")
    core = router.router.core
    assert core.policy.worker_of(weird) is not None
    url = router.url + "/finish_session"
    for sid in (weird, weird, "unknown", ""):
        async with client.post(url, params={"session_id": sid}) as r:
            assert r.status == 200
            assert await r.json() == {"status": "ok", "session_id": sid}
    assert core.policy.worker_of(weird) is None
    assert core.policy.worker_of("plain") is not None  # matched exactly, nothing else released
    async with client.post(url) as r:
        assert r.status == 400
        assert "session_id" in (await r.json())["error"]["message"]
    async with client.get(url, params={"session_id": "x"}) as r:
        assert r.status == 405
        assert (await r.json())["error"]["code"] == "method_not_allowed"
    stateless = await make_router([backends[0].url], policy="consistent_hash")
    async with client.post(stateless.url + "/finish_session?session_id=x") as r:
        assert r.status == 200


async def test_worker_admin(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    first, second, third = backends
    router = await make_router([first.url, second.url], policy="sticky_least_loaded")
    for i in range(6):
        await post_chat(client, router, f"w-{i}")
    homes = {s: b.url for b in (first, second) for s in b.sessions()}
    async with client.post(router.url + "/add_worker", params={"url": third.url}) as r:
        assert r.status == 200
    async with client.post(router.url + "/add_worker", params={"url": third.url}) as r:
        assert r.status == 400 and "already" in (await r.json())["error"]["message"]
    async with client.get(router.url + "/list_workers") as r:
        assert await r.json() == {"urls": [first.url, second.url, third.url]}
    await post_chat(client, router, "w-new")
    assert third.sessions() == ["w-new"]  # the empty worker takes the next new session
    async with client.post(router.url + "/remove_worker", params={"url": first.url}) as r:
        assert r.status == 200
    async with client.post(router.url + "/remove_worker", params={"url": first.url}) as r:
        assert r.status == 400
    for b in backends:
        b.seen.clear()
    for sid, home in homes.items():
        await post_chat(client, router, sid)
        if home == second.url:
            assert sid in second.sessions()  # sessions on surviving workers never move
        else:
            assert sid not in first.sessions()
    sick = (await start_backends(1))[0]
    sick.health_ok = False
    try:
        async with client.post(router.url + "/add_worker", params={"url": sick.url}) as r:
            assert r.status == 400 and "health check" in (await r.json())["error"]["message"]
    finally:
        await sick.kill()
    async with client.post(router.url + "/add_worker") as r:
        assert r.status == 400


async def test_probes_models_and_unknown_routes(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends])
    async with client.get(router.url + "/liveness") as r:
        assert r.status == 200
    async with client.get(router.url + "/readiness") as r:
        assert r.status == 200
        assert await r.json() == {"status": "ready", "healthy_workers": 3, "total_workers": 3}
    async with client.get(router.url + "/health") as r:
        assert r.status == 200
    async with client.get(router.url + "/v1/models") as r:
        assert r.status == 200
        assert (await r.json())["data"][0]["id"] == "fake-model"
    async with client.get(router.url + "/nope") as r:
        assert r.status == 404
        assert set((await r.json())["error"]) == {"message", "type", "code"}


async def test_metrics_per_router_and_prometheus_port(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    a = await make_router([backends[0].url], policy="sticky_least_loaded", prometheus_port=0)
    b = await make_router([backends[0].url], policy="sticky_least_loaded")
    for i in range(3):
        await post_chat(client, a, f"m-{i}")
    await client.post(a.url + "/finish_session?session_id=m-0")
    async with client.get(a.url + "/metrics") as r:
        text = await r.text()
    w = backends[0].url
    for line in (
        f'sessionroute_requests_total{{status="200",worker="{w}"}} 3.0',
        'sessionroute_decisions_total{kind="new"} 3.0',
        f'sessionroute_active_sessions{{worker="{w}"}} 2.0',
        f'sessionroute_in_flight{{worker="{w}"}} 0.0',
        f'sessionroute_circuit_state{{worker="{w}"}} 0.0',
        "sessionroute_sessions_released_total 1.0",
        "sessionroute_sessions_expired_total 0.0",
        "sessionroute_routing_decision_seconds_count 3.0",
        f'sessionroute_upstream_seconds_count{{worker="{w}"}} 3.0',
    ):
        assert line in text, line
    assert a.metrics_port is not None
    async with client.get(f"http://127.0.0.1:{a.metrics_port}/metrics") as r:
        assert r.status == 200 and "sessionroute_decisions_total" in await r.text()
    async with client.get(b.url + "/metrics") as r:  # a second router has its own registry
        assert 'sessionroute_decisions_total{kind="new"} 0.0' in await r.text()


async def test_router_api_key(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([backends[0].url], router_api_key="s3cret")
    for method, path in (
        ("POST", "/v1/chat/completions"),
        ("POST", "/finish_session?session_id=x"),
        ("GET", "/metrics"),
        ("GET", "/list_workers"),
        ("GET", "/v1/models"),
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            async with client.request(method, router.url + path, headers=headers, json={}) as r:
                assert r.status == 401, (path, headers)
                assert (await r.json())["error"]["code"] == "invalid_api_key"
        async with client.request(
            method, router.url + path, headers={"Authorization": "Bearer s3cret"}, json=chat()
        ) as r:
            assert r.status == 200, path
    for path in ("/liveness", "/readiness", "/health"):
        async with client.get(router.url + path) as r:
            assert r.status == 200, path
    assert len(backends[0].seen) == 1  # only the authorised generation request got through


async def test_content_policy_parses_body_and_rejects_malformed_json(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    RecordingContentPolicy.seen.clear()
    router = await make_router([backends[0].url], policy=f"{__name__}:RecordingContentPolicy")
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "sys. " * 20},
            {"role": "user", "content": [{"type": "text", "text": "part" * 9}, {"type": "image"}]},
        ],
    }
    async with client.post(router.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
    async with client.post(router.url + "/v1/completions", json={"prompt": "abc" * 50}) as r:
        assert r.status == 200
    block = 16 * BYTES_PER_TOKEN  # the default content block, in bytes of text
    assert RecordingContentPolicy.seen == [
        (text_block_keys("sys. " * 20 + "part" * 9, block), "m"),
        (text_block_keys("abc" * 50, block), None),
    ]
    assert [len(b or []) for b, _ in RecordingContentPolicy.seen] == [2, 2]
    for raw in (b"{not json", b"\xff\xfe", b"", b"[" * 100_000):
        async with client.post(router.url + "/v1/chat/completions", data=raw, headers=JSON) as r:
            assert r.status == 400
            err = (await r.json())["error"]
            assert err["code"] == "malformed_json" and err["type"] == "invalid_request_error"
    assert len(backends[0].seen) == 2
    assert router.router.core.cluster.in_flight(backends[0].url) == 0


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 500):
        yield data[i : i + 500]


@pytest.mark.parametrize("chunked", [False, True])
async def test_oversize_body_is_413(
    chunked: bool,
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
) -> None:
    router = await make_router([backends[0].url], max_payload_size=1000)
    big = json.dumps({"model": "m", "prompt": "x" * 2000}).encode()
    data: Any = _chunks(big) if chunked else big
    async with client.post(router.url + "/v1/completions", data=data, headers=JSON) as r:
        assert r.status == 413
        assert (await r.json())["error"]["code"] == "payload_too_large"
    assert backends[0].seen == []
    small = json.dumps({"model": "m", "prompt": "x"}).encode()
    async with client.post(router.url + "/v1/completions", data=small, headers=JSON) as r:
        assert r.status == 200
