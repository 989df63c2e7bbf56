"""Session ids from any client, live (issue 40): a client that sends only
``prompt_cache_key`` or only ``user`` keeps its turns on one worker; ``consistent_hash``
places every key of vllm-router's chain where vllm-router 0.1.17 does (compared with the real
binary); ``GET /sessions/{id}`` names the id's origin."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from sessionroute.router.config import VLLM_ROUTER_SESSION_HEADERS

from .backend import FakeBackend
from .conftest import JSON, MakeRouter
from .vllm_router_017 import running_vllm_router


async def _worker(
    client: aiohttp.ClientSession,
    url: str,
    turn: int,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> str:
    """POST one chat turn; returns the port of the fake worker that answered."""
    payload = {"model": "m", "messages": [{"role": "user", "content": f"turn {turn}"}], **body}
    async with client.post(
        url + "/v1/chat/completions", json=payload, headers={**JSON, **(headers or {})}
    ) as r:
        assert r.status == 200, await r.text()
        return str((await r.json())["choices"][0]["message"]["content"]).split()[-1]


@pytest.mark.parametrize("field", ["prompt_cache_key", "user", "session_params"])
@pytest.mark.parametrize("policy", ["sticky_least_loaded", "consistent_hash"])
async def test_a_body_only_id_keeps_every_turn_on_one_worker(
    field: str,
    policy: str,
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
) -> None:
    router = await make_router([b.url for b in backends], policy=policy)
    homes: dict[str, set[str]] = {}
    for turn in range(4):
        for i in range(12):
            sid = f"{field}-{i}"
            body = (
                {"session_params": {"session_id": sid}}
                if field == "session_params"
                else {field: sid}
            )
            homes.setdefault(sid, set()).add(await _worker(client, router.url, turn, body))
    assert all(len(h) == 1 for h in homes.values()), homes
    assert len(set().union(*homes.values())) > 1  # and sessions are spread


async def test_sessions_endpoint_names_the_origin(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends])
    await _worker(client, router.url, 0, {"prompt_cache_key": "pck-1"})
    await _worker(client, router.url, 0, {}, {"x-session-id": "hdr-1"})
    for sid, origin in (("pck-1", "body:prompt_cache_key"), ("hdr-1", "x-session-id")):
        async with client.get(router.url + f"/sessions/{sid}") as r:
            assert r.status == 200
            assert (await r.json())["origin"] == origin


async def test_consistent_hash_matches_vllm_router_for_each_key_of_its_chain(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    """vllm-router's chain (0.1.17, measured): its six headers, then a body
    ``session_params.session_id``; 20 ids per key, the same workers' URLs for both routers."""
    workers = [b.url for b in backends]
    cases: list[tuple[str, dict[str, Any], dict[str, str]]] = []
    for name in VLLM_ROUTER_SESSION_HEADERS:
        cases += [(f"{name}-{i}", {}, {name: f"{name}-{i}"}) for i in range(20)]
    cases += [(f"sp-{i}", {"session_params": {"session_id": f"sp-{i}"}}, {}) for i in range(20)]
    # a header wins over the body
    cases += [(f"both-{i}", {"session_params": {"session_id": "x"}}, {"x-user-id": f"both-{i}"})
              for i in range(10)]  # fmt: skip
    async with running_vllm_router(client, workers, "--policy", "consistent_hash") as theirs:
        expected = [await _worker(client, theirs, 0, body, hdrs) for _, body, hdrs in cases]
    ours = await make_router(
        workers, policy="consistent_hash", session_headers=VLLM_ROUTER_SESSION_HEADERS
    )
    got = [await _worker(client, ours.url, 0, body, hdrs) for _, body, hdrs in cases]
    assert len(set(expected)) == 3  # the ids spread over all three workers
    mismatches = [c[0] for c, e, g in zip(cases, expected, got, strict=True) if e != g]
    assert mismatches == []
