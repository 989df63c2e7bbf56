"""Placement, stickiness, finish_session, stateless requests and header/body proxying."""

from __future__ import annotations

import re

import aiohttp
import pytest

from sessionroute.types import DecisionKind

from .backend import FakeBackend, start_backends
from .conftest import MakeRouter, chat, post_chat

FIXED_PORTS = (18001, 18002, 18003)


def _words(text: str) -> list[str]:
    return text.split()


# shared/ROUTER.md: 0-4:b2 5-10:b3 11,12:b1 13:b3 14:b2 15:b1 16-19:b3 20:b1 21:b3 22:b1 23:b2
# 24,25:b1 26,27:b2 28:b1 29:b2 (consistent_hash), and the sticky_least_loaded sequence.
CONSISTENT = _words(
    "b2 b2 b2 b2 b2 b3 b3 b3 b3 b3 b3 b1 b1 b3 b2 b1 b3 b3 b3 b3 b1 b3 b1 b2 b1 b1 b2 b2 b1 b2"
)
STICKY = _words(
    "b2 b3 b1 b1 b2 b3 b1 b3 b2 b3 b1 b2 b1 b2 b3 b3 b1 b2 b1 b3 b2 b2 b3 b1 b2 b3 b1 b3 b1 b2"
)


def owner(backends: list[FakeBackend], session: str) -> str:
    """``b1``..``b3``: the one backend that served ``session`` (fails if several did)."""
    owners = {f"b{i + 1}" for i, b in enumerate(backends) if session in b.sessions()}
    assert len(owners) == 1, (session, owners)
    return owners.pop()


@pytest.mark.parametrize(
    ("policy", "expected"), [("consistent_hash", CONSISTENT), ("sticky_least_loaded", STICKY)]
)
async def test_exact_placements_through_http(
    policy: str, expected: list[str], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    backends = await start_backends(3, FIXED_PORTS)
    try:
        assert [b.url for b in backends] == [f"http://127.0.0.1:{p}" for p in FIXED_PORTS]
        router = await make_router([b.url for b in backends], policy=policy)
        for i in range(30):
            status, _ = await post_chat(client, router, f"sess-{i}")
            assert status == 200
        assert [owner(backends, f"sess-{i}") for i in range(30)] == expected
        if policy == "sticky_least_loaded":
            # Scenario 2: releasing sess-0 (on b2, counts 10/10/10) frees b2 for the next one.
            counts = router.router.core.policy.session_counts()
            assert sorted(counts.values()) == [10, 10, 10]
            async with client.post(router.url + "/finish_session?session_id=sess-0") as r:
                assert r.status == 200
                assert await r.json() == {"status": "ok", "session_id": "sess-0"}
            assert router.router.core.policy.session_counts()[backends[1].url] == 9
            await post_chat(client, router, "sess-30")
            assert owner(backends, "sess-30") == "b2"
    finally:
        for b in backends:
            await b.kill()


@pytest.mark.parametrize("policy", ["consistent_hash", "sticky_least_loaded"])
async def test_scenario1_sessions_never_move(
    policy: str,
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
) -> None:
    router = await make_router([b.url for b in backends], policy=policy)
    for i in range(30):
        sid = f"s1-{i}"
        assert (await post_chat(client, router, sid))[0] == 200
        assert (await post_chat(client, router, sid, path="/v1/completions"))[0] == 200
        async with client.post(
            router.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
            headers={"x-session-id": sid},
        ) as resp:
            assert resp.status == 200
            text = (await resp.read()).decode()
            assert text.endswith("data: [DONE]\n\n")
    for i in range(30):
        sid = f"s1-{i}"
        o = owner(backends, sid)
        assert backends[int(o[1]) - 1].sessions().count(sid) == 3
    assert sum(len(b.seen) for b in backends) == 90


async def test_scenario3_stateless_requests_change_no_counts(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends], policy="sticky_least_loaded")
    for i in range(5):
        await post_chat(client, router, f"st-{i}")
    core = router.router.core
    before = dict(core.policy.session_counts())
    for i in range(12):
        async with client.post(
            router.url + "/v1/chat/completions",
            json=chat(),
            headers={"x-request-id": f"r{i}"},
        ) as r:
            assert r.status == 200
    assert dict(core.policy.session_counts()) == before
    assert core.decisions[DecisionKind.STATELESS] == 12
    assert all(core.cluster.in_flight(b.url) == 0 for b in backends)
    # Ties (nothing in flight) break by rendezvous on the request id, so they spread out.
    assert sum(1 for b in backends if None in b.sessions()) >= 2


async def test_headers_and_body_forwarded_as_received(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([backends[0].url], policy="consistent_hash")
    raw = b'{ "model" :"m",  "messages":[{"role":"user","content":"caf\\u00e9"}] , "z":1}'
    async with client.post(
        router.url + "/v1/chat/completions",
        data=raw,
        headers={
            "Content-Type": "application/json",
            "x-session-id": "h-1",
            "X-Custom": "kept",
            "Authorization": "Bearer client-key",
            "Proxy-Authorization": "secret",
            "Keep-Alive": "timeout=5",
            "x-request-id": "my-id-7",
        },
    ) as resp:
        assert resp.status == 200
        assert resp.headers["x-request-id"] == "my-id-7"
        assert "Keep-Alive" not in resp.headers
    seen = backends[0].seen[-1]
    assert seen.body == raw
    h = {k.lower(): v for k, v in seen.headers.items()}
    assert h["x-custom"] == "kept"
    assert h["authorization"] == "Bearer client-key"
    assert h["x-request-id"] == "my-id-7"
    assert "proxy-authorization" not in h and "keep-alive" not in h
    assert h["host"] == f"127.0.0.1:{backends[0].port}"
    assert h["content-length"] == str(len(raw))
    assert "user-agent" in h  # aiohttp's own, forwarded from the client untouched


@pytest.mark.parametrize(
    ("path", "prefix"),
    [
        ("/v1/chat/completions", "chatcmpl-"),
        ("/v1/completions", "cmpl-"),
        ("/v1/embeddings", "req-"),
    ],
)
async def test_generated_request_id(
    path: str,
    prefix: str,
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
) -> None:
    router = await make_router([backends[0].url])
    async with client.post(
        router.url + path, json={"model": "m", "prompt": "x", "input": "x"}
    ) as r:
        rid = r.headers["x-request-id"]
    assert re.fullmatch(re.escape(prefix) + "[A-Za-z0-9]{24}", rid), rid
    # --request-id-headers chooses the echoed header; it does not change routing.
    router2 = await make_router([backends[1].url], request_id_headers=("x-my-trace",))
    async with client.post(
        router2.url + path, json=chat(), headers={"x-my-trace": "t-1", "x-request-id": "no"}
    ) as r:
        assert r.headers["x-request-id"] == "t-1"


async def test_router_api_key_is_not_forwarded_and_worker_key_is_sent(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router(
        [backends[0].url], router_api_key="router-secret", api_key="worker-secret"
    )
    async with client.post(
        router.url + "/v1/chat/completions",
        json=chat(),
        headers={"Authorization": "Bearer router-secret"},
    ) as r:
        status = r.status
    assert status == 200
    h = {k.lower(): v for k, v in backends[0].seen[-1].headers.items()}
    assert h["authorization"] == "Bearer worker-secret"


async def test_vllm_router_session_header_list(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    """With vllm-router's header list, x-user-id: Z and x-session-id: Z are one session."""
    from sessionroute.router.config import VLLM_ROUTER_SESSION_HEADERS

    router = await make_router(
        [b.url for b in backends],
        policy="sticky_least_loaded",
        session_headers=VLLM_ROUTER_SESSION_HEADERS,
    )
    for name in ("x-session-id", "x-user-id", "X-Trace-Id"):
        async with client.post(
            router.url + "/v1/chat/completions", json=chat(), headers={name: "Z"}
        ) as r:
            assert r.status == 200
    owners = [b for b in backends if b.seen]
    assert len(owners) == 1 and len(owners[0].seen) == 3
    assert len(router.router.core.policy.session_counts()) == 1


async def test_compressed_body_is_forwarded_as_received(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    import gzip

    router = await make_router([backends[0].url])
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "zip"}]}'
    async with client.post(
        router.url + "/v1/chat/completions",
        data=gzip.compress(raw),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    ) as r:
        assert r.status == 200  # the backend could decompress it: bytes and header intact
    seen = backends[0].seen[-1]
    assert seen.body == raw  # decompressed by the backend itself
    assert {k.lower(): v for k, v in seen.headers.items()}["content-encoding"] == "gzip"


async def test_worker_url_with_trailing_slash(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([backends[0].url + "/"])
    assert (await post_chat(client, router, "slash"))[0] == 200
    assert backends[0].seen[-1].path == "/v1/chat/completions"
    async with client.get(router.url + "/v1/models") as r:
        assert r.status == 200
