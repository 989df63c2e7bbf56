"""vllm-router's rate limit and queue flags, live: 429 with Retry-After when the queue is full,
408 when the wait times out, the queued request served when a token comes back (issue 40).
vllm-router 0.1.17 answers the same statuses (measured with its binary: 429 + Retry-After: 1
with --max-concurrent-requests 1 --queue-size 0, 408 on a queue timeout)."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from sessionroute.clock import MonotonicClock
from sessionroute.errors import AdmissionRefused
from sessionroute.serve.errors import error_for_exception

from .backend import FakeBackend
from .conftest import JSON, MakeRouter, chat


async def _post(client: aiohttp.ClientSession, url: str) -> tuple[int, str | None]:
    async with client.post(url + "/v1/chat/completions", json=chat(), headers=JSON) as r:
        await r.read()
        return r.status, r.headers.get("Retry-After")


async def _wait_for(backend: FakeBackend, n: int) -> None:
    for _ in range(500):
        if len(backend.seen) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the backend saw {len(backend.seen)} requests, not {n}")


async def test_full_queue_is_429_with_retry_after(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    router = await make_router(
        [b.url], max_concurrent_requests=1, rate_limit_tokens_per_second=0.001, queue_size=0
    )
    b.hold = asyncio.Event()
    first = asyncio.create_task(_post(client, router.url))
    await _wait_for(b, 1)
    assert [await _post(client, router.url) for _ in range(3)] == [(429, "1")] * 3
    b.hold.set()
    assert (await first)[0] == 200
    assert (await _post(client, router.url))[0] == 200  # the token came back


async def test_queued_requests_wait_for_a_token_or_time_out_with_408(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    b = backends[0]
    router = await make_router(
        [b.url],
        clock=MonotonicClock(),  # the core's timers (queue deadline, refill) need real time
        max_concurrent_requests=1,
        rate_limit_tokens_per_second=0.001,
        queue_size=1,
        queue_timeout_secs=0.3,
    )
    b.hold = asyncio.Event()
    first = asyncio.create_task(_post(client, router.url))
    await _wait_for(b, 1)
    assert await _post(client, router.url) == (408, None)  # waited 0.3 s for a token
    queued = asyncio.create_task(_post(client, router.url))
    await asyncio.sleep(0)
    for _ in range(100):  # until it waits in the queue
        if router.router.core.admission.waiting:
            break
        await asyncio.sleep(0.005)
    b.hold.set()  # the first completes, gives its token back: the queued one is served
    assert (await first)[0] == 200
    assert (await queued)[0] == 200


def test_the_refusals_have_a_typed_openai_error_body() -> None:
    """A queue timeout (408) is a ``timeout_error`` like the upstream's 504, a full queue
    (429) a ``rate_limit_error`` with its ``Retry-After`` (the body's ``type`` was the
    generic ``error`` for 408)."""
    timeout = error_for_exception(AdmissionRefused("waited 0.3 s", "timeout", status=408))
    full = error_for_exception(AdmissionRefused("full", "queue_full", status=429, retry_after_s=1))
    assert json.loads(timeout.body)["error"]["type"] == "timeout_error"
    assert json.loads(full.body)["error"]["type"] == "rate_limit_error"
    assert (timeout.status, full.status, full.headers) == (408, 429, (("Retry-After", "1"),))
