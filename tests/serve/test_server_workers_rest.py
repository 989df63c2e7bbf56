"""vllm-router's REST worker routes (``POST /workers``, ``GET``/``DELETE /workers/{url}``) over
HTTP with real backends: the routing core learns and forgets workers at runtime."""

from __future__ import annotations

import asyncio
from urllib.parse import quote

import aiohttp

from sessionroute.types import DecisionKind

from .backend import FakeBackend, start_backends
from .conftest import JSON, MakeRouter, post_chat


def _one(url: str) -> str:
    return "/workers/" + quote(url, safe="")


async def test_post_workers_adds_a_worker_that_takes_new_sessions(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    first, second, third = backends
    router = await make_router([first.url, second.url], policy="sticky_least_loaded")
    for i in range(4):
        await post_chat(client, router, f"old-{i}")
    async with client.post(router.url + "/workers", json={"url": third.url}) as r:
        assert r.status == 200
        assert await r.json() == {
            "success": True,
            "message": f"Successfully added worker: {third.url}",
        }
    async with client.post(router.url + "/workers", json={"url": third.url, "priority": 9}) as r:
        assert r.status == 400
        assert await r.json() == {
            "error": f"Worker {third.url} already exists",
            "code": "ADD_WORKER_FAILED",
        }
    async with client.get(router.url + "/list_workers") as r:
        assert (await r.json())["urls"] == [first.url, second.url, third.url]
    await post_chat(client, router, "new")
    assert third.sessions() == ["new"]  # the empty worker takes the next new session
    async with client.get(router.url + _one(third.url)) as r:
        assert r.status == 200
        assert await r.json() == {"url": third.url, "model_id": "unknown", "is_healthy": True}
    async with client.get(router.url + _one("http://127.0.0.1:9")) as r:
        assert r.status == 404 and (await r.json())["code"] == "WORKER_NOT_FOUND"


async def test_post_workers_refuses_bad_bodies_as_vllm_router(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([backends[0].url])
    url = router.url + "/workers"
    async with client.post(url, data=b'{"url": "http://x"}') as r:  # no JSON content type
        assert r.status == 415
    async with client.post(url, data=b"{", headers=JSON) as r:
        assert r.status == 400 and "JSON" in await r.text()
    async with client.post(url, json={"model_id": "m"}) as r:
        assert r.status == 422 and "url" in await r.text()
    async with client.post(url, json={"url": "127.0.0.1:8000"}) as r:
        assert r.status == 400 and (await r.json())["code"] == "ADD_WORKER_FAILED"
    async with client.get(router.url + "/list_workers") as r:
        assert (await r.json())["urls"] == [backends[0].url]


async def test_post_workers_waits_for_a_starting_worker_up_to_the_startup_timeout(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router(
        [backends[0].url], worker_startup_timeout_secs=30.0, worker_startup_check_interval=0.02
    )
    late = (await start_backends(1))[0]
    late.health_ok = False
    try:
        add = asyncio.create_task(client.post(router.url + "/workers", json={"url": late.url}))
        while late.health_checks < 2:  # it is being checked again and again
            await asyncio.sleep(0.005)
        assert late.url not in router.router.core.cluster
        late.health_ok = True
        async with await add as r:
            assert r.status == 200
        assert late.url in router.router.core.cluster
    finally:
        await late.kill()
    quick = await make_router(
        [backends[0].url], worker_startup_timeout_secs=0.1, worker_startup_check_interval=0.02
    )
    async with client.post(quick.url + "/workers", json={"url": "http://127.0.0.1:9"}) as r:
        assert r.status == 400
        body = await r.json()
        assert body["code"] == "ADD_WORKER_FAILED" and "Timeout 0.1s" in body["error"]


async def test_delete_workers_lets_in_flight_finish_and_re_places_its_sessions(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    first, second, _ = backends
    router = await make_router([first.url, second.url], policy="sticky_least_loaded")
    core = router.router.core
    await post_chat(client, router, "a")
    await post_chat(client, router, "b")
    home = core.policy.worker_of("a")
    gone = first if home == first.url else second
    stays = second if gone is first else first
    hold = asyncio.Event()
    gone.hold = hold
    in_flight = asyncio.create_task(post_chat(client, router, "a"))
    while len(gone.seen) < 2:
        await asyncio.sleep(0.002)
    async with client.delete(router.url + _one(gone.url)) as r:
        assert r.status == 200
        assert await r.json() == {
            "success": True,
            "message": f"Worker {gone.url} removed successfully",
        }
    assert gone.url not in core.cluster
    hold.set()
    assert (await in_flight)[0] == 200  # the request in flight there finished
    stays.seen.clear()
    repinned = core.decisions[DecisionKind.REPINNED]
    assert (await post_chat(client, router, "a"))[0] == 200  # its next turn: placed again
    assert stays.sessions() == ["a"] and core.policy.worker_of("a") == stays.url
    assert core.decisions[DecisionKind.REPINNED] == repinned + 1
    async with client.delete(router.url + _one(gone.url)) as r:  # unknown: 200, as vllm-router
        assert r.status == 200
    async with client.get(router.url + _one(gone.url)) as r:
        assert r.status == 404


async def test_worker_writes_are_admin_routes(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([backends[0].url], router_api_key="s3cret")
    other = backends[1].url
    async with client.post(router.url + "/workers", json={"url": other}) as r:
        assert r.status == 401
    async with client.delete(router.url + _one(backends[0].url)) as r:
        assert r.status == 401
    auth = {"Authorization": "Bearer s3cret"}
    async with client.post(router.url + "/workers", json={"url": other}, headers=auth) as r:
        assert r.status == 200
    async with client.delete(router.url + _one(other), headers=auth) as r:
        assert r.status == 200
    assert other not in router.router.core.cluster


async def test_a_worker_url_is_matched_exactly_as_given_trailing_slash_included(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    """As vllm-router 0.1.17 (measured with its binary): a worker started or added with a
    trailing slash shows, and is removed, under that exact string. Stripping it in the
    admin routes only left a ``--worker-urls http://h:p/`` worker impossible to remove:
    ``DELETE /workers/{url}`` answered "removed" and kept it, ``/remove_worker`` said unknown."""
    first, second, third = (b.url + "/" for b in backends)
    router = await make_router([first, second])
    cluster = router.router.core.cluster
    async with client.delete(router.url + _one(first)) as r:
        assert (
            r.status == 200
            and (await r.json())["message"] == f"Worker {first} removed successfully"
        )
    assert first not in cluster
    async with client.post(router.url + "/remove_worker", params={"url": second}) as r:
        assert r.status == 200
    assert second not in cluster
    async with client.post(router.url + "/workers", json={"url": third}) as r:
        assert await r.json() == {"success": True, "message": f"Successfully added worker: {third}"}
    async with client.get(router.url + _one(third)) as r:
        assert r.status == 200 and (await r.json())["url"] == third
    async with client.get(router.url + "/list_workers") as r:
        assert (await r.json())["urls"] == [third]
    assert (await post_chat(client, router, "s"))[0] == 200  # proxied to http://h:p/v1/...
