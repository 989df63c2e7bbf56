"""TTL expiry (scenario 7), graceful shutdown, the OpenAI SDK as a client."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import aiohttp
import openai
import pytest

from sessionroute.clock import ManualClock
from sessionroute.serve import RouterSettings
from sessionroute.serve.runner import serve
from sessionroute.types import DecisionKind

from .backend import FakeBackend
from .conftest import FAST, MakeRouter, post_chat


async def test_scenario7_idle_session_is_placed_as_new(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    clock = ManualClock()
    router = await make_router(
        [b.url for b in backends], clock=clock, policy="sticky_least_loaded", session_ttl_secs=10
    )
    core = router.router.core
    await post_chat(client, router, "ttl-1")
    clock.advance(9.0)
    await post_chat(client, router, "ttl-1")
    assert core.decisions[DecisionKind.STICKY] == 1
    clock.advance(10.0)  # idle for exactly the TTL: expired
    await post_chat(client, router, "ttl-1")
    assert core.decisions[DecisionKind.NEW] == 2
    assert core.policy.session_stats().expired == 1


async def test_background_sweep_expires_idle_sessions(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    clock = ManualClock()
    router = await make_router(
        [b.url for b in backends],
        clock=clock,
        policy="sticky_least_loaded",
        session_ttl_secs=10,
        session_sweep_interval_secs=0.01,
    )
    for i in range(4):
        await post_chat(client, router, f"sw-{i}")
    policy = router.router.core.policy
    assert sum(policy.session_counts().values()) == 4
    clock.advance(11.0)
    for _ in range(500):  # the sweeper runs every 10 ms of real time
        if policy.session_stats().expired == 4:
            break
        await asyncio.sleep(0.01)
    assert policy.session_stats().expired == 4
    assert dict(policy.session_counts()) == {}


async def test_graceful_shutdown_lets_in_flight_requests_finish(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    b.hold = asyncio.Event()
    router = await make_router([b.url], shutdown_timeout_secs=5.0)
    pending = asyncio.create_task(post_chat(client, router, "g-1"))
    while not b.seen:  # wait until the request reached the backend
        await asyncio.sleep(0.005)
    stopping = asyncio.create_task(router.stop())
    refused: Exception | None = None
    for _ in range(200):  # until the listener is closed
        try:
            async with aiohttp.ClientSession() as fresh, fresh.get(router.url + "/liveness"):
                pass
        except aiohttp.ClientConnectionError as exc:
            refused = exc
            break
        await asyncio.sleep(0.005)
    assert refused is not None  # new connections are refused while the request is in flight
    assert not stopping.done()
    b.hold.set()
    status, body = await pending
    assert status == 200 and body["object"] == "chat.completion"
    await asyncio.wait_for(stopping, 5)


async def test_openai_sdk_async_and_sync(
    backends: list[FakeBackend], make_router: MakeRouter
) -> None:
    router = await make_router([b.url for b in backends], policy="sticky_least_loaded")
    aclient = openai.AsyncOpenAI(
        base_url=router.url + "/v1", api_key="none", default_headers={"x-session-id": "sdk-a"}
    )
    r = await aclient.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    content = r.choices[0].message.content
    assert content is not None and content.startswith("port ")
    stream = await aclient.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert pieces == ["tok0 ", "tok1 ", "tok2 "]
    c = await aclient.completions.create(model="m", prompt="p")
    assert c.choices[0].text == content
    await aclient.close()

    def sync_calls() -> tuple[str | None, list[str | None], str]:
        with openai.OpenAI(
            base_url=router.url + "/v1",
            api_key="none",
            default_headers={"x-session-id": "sdk-a"},
        ) as sclient:
            r = sclient.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
            s = sclient.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            pieces = [ch.choices[0].delta.content for ch in s if ch.choices]
            c = sclient.completions.create(model="m", prompt="p", stream=True)
            text = "".join(ch.choices[0].text for ch in c)
            return r.choices[0].message.content, pieces, text

    sync_content, sync_pieces, text = await asyncio.to_thread(sync_calls)
    assert sync_content == content  # same session, same worker
    assert sync_pieces == ["tok0 ", "tok1 ", "tok2 "]
    assert text == "tok0 tok1 tok2 "
    served = [b for b in backends if b.seen]
    assert len(served) == 1 and set(served[0].sessions()) == {"sdk-a"}


async def test_serve_without_workers_warns_how_to_add_one(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sessionroute.serve")
    stop = asyncio.Event()
    task = asyncio.create_task(serve(RouterSettings.build(**FAST, worker_urls=()), stop))
    for _ in range(1000):  # until the router is up and has logged
        if task.done() or any("no workers" in r.getMessage() for r in caplog.records):
            break
        await asyncio.sleep(0.01)
    stop.set()
    await task
    warned = [r.getMessage() for r in caplog.records if "no workers" in r.getMessage()]
    assert len(warned) == 1 and "/add_worker" in warned[0]


def test_the_router_process_freezes_what_start_up_made_out_of_the_garbage_collector() -> None:
    """``run`` (``sessionroute serve``) freezes the start-up objects (a full collection then
    skips them) and unfreezes them on return; a router started in a process of its own, a
    child, so the test process's collector is left alone."""
    code = (
        "import asyncio, gc, logging\n"
        "from sessionroute.serve import RouterSettings\n"
        "from sessionroute.serve.runner import serve\n"
        "said = []\n"
        "class Up(logging.Handler):\n"
        "    def emit(self, record):\n"
        "        said.append(record.getMessage())\n"
        "log = logging.getLogger('sessionroute.serve')\n"
        "log.addHandler(Up())\n"
        "log.setLevel(logging.INFO)\n"
        "async def main(freeze):\n"
        "    said.clear()\n"
        "    stop = asyncio.Event()\n"
        "    task = asyncio.create_task(serve(RouterSettings.build(port=0), stop, "
        "freeze_gc=freeze))\n"
        "    for _ in range(600):  # until it says it is up (logged after the freeze)\n"
        "        await asyncio.sleep(0.05)\n"
        "        if any(m.startswith('sessionroute router on') for m in said):\n"
        "            break\n"
        "    else:\n"
        "        raise SystemExit('the router never said it was up')\n"
        "    await asyncio.sleep(0.1)\n"
        "    frozen = gc.get_freeze_count()\n"
        "    stop.set()\n"
        "    await task\n"
        "    return frozen, gc.get_freeze_count()\n"
        "print(*asyncio.run(main(False)), *asyncio.run(main(True)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    plain_up, plain_after, frozen_up, frozen_after = map(int, out.stdout.split())
    assert plain_up == plain_after == 0
    assert frozen_up > 10_000 and frozen_after == 0
