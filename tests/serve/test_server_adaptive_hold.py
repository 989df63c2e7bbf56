"""``adaptive_hold`` through the real router over HTTP: a running session's next turn is held
at the router, other sessions' turns pass, and it resumes once its worker drains."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from sessionroute.clock import MonotonicClock
from sessionroute.router.policies.adaptive_hold import AdaptiveHoldPolicy

from .backend import FakeBackend
from .conftest import MakeRouter, post_chat


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_serve_holds_a_running_sessions_turn_and_resumes_it(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    url = backends[0].url
    router = await make_router(  # the core's re-check timer follows the router's clock
        [url],
        clock=MonotonicClock(),
        policy="adaptive_hold",
        # rule 6 off: the fake backend queues nothing, so a held turn would leave at once
        policy_option=("hold_check_s=0.02", "wait_bound=false"),
    )
    core = router.router.core
    policy = core.policy
    assert isinstance(policy, AdaptiveHoldPolicy) and core.admission_recheck_s == 0.02
    for s in ("s0", "s1", "s2"):
        assert (await post_chat(client, router, s))[0] == 200
    # The worker's ceiling (learned from thrashing gauges in a run) is set by hand: s0's next
    # turn goes, then the newest sessions are held until the working set is under it.
    working_set = policy.context_tokens()[url]
    policy.ceiling[url] = working_set / 2
    assert (await post_chat(client, router, "s0"))[0] == 200
    held = list(policy.held())
    assert held and held[0] == "s2"  # newest first
    waiting = asyncio.create_task(post_chat(client, router, held[0]))
    await _until(lambda: len(core.admission) == 1)  # held at the router
    assert (await post_chat(client, router, "s0"))[0] == 200  # s0 is not held: it passes
    assert len(core.admission) == 1 and not waiting.done()
    policy.ceiling.clear()  # the worker drained: the driver's next re-check resumes it
    assert (await waiting)[0] == 200
    assert policy.held() == {} and policy.released["resumed"] == len(held)
    assert policy.held_turns == 1
    assert [s.session for s in backends[0].seen].count(held[0]) == 2


async def test_serve_places_short_sessions_by_shared_prefix_under_a_serving_objective(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    """``--objective serving`` (``short_place = "cache_aware_v2"``): the router reads prompt
    content, and once the sessions that ended had one turn each, a new session whose prompt
    extends another session's goes to that session's backend, though it holds more."""
    router = await make_router(
        [b.url for b in backends], policy="adaptive_hold", objective="serving"
    )
    core = router.router.core
    assert core.requests.needs_content
    for sid in ("o1", "o2"):
        assert (await post_chat(client, router, sid))[0] == 200
        async with client.post(router.url + "/finish_session", params={"session_id": sid}) as r:
            assert r.status == 200
    policy = core.policy
    assert isinstance(policy, AdaptiveHoldPolicy) and policy.mean_turns == 1
    prefix = "You are a careful coding agent; read the repository first. " * 40
    assert (await post_chat(client, router, "big", content=prefix))[0] == 200
    for i in range(3):
        assert (await post_chat(client, router, f"n{i}", content=prefix + f"task {i}"))[0] == 200
    big = policy.worker_of("big")
    assert big is not None and all(policy.worker_of(f"n{i}") == big for i in range(3))
    assert policy.counters()["short_placed"] == 5  # o2, big, n0-n2
