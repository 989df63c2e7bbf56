"""One router, two drivers: the simulator and ``sessionroute serve`` decide alike.

One scripted event sequence — a burst of first turns at an idle pool, later turns, a worker
that dies between turns (its sessions are refused and re-placed), a release and a new session,
idle expiry — runs through the simulator's router (a :class:`Simulation` whose replicas carry
the backends' URLs, in virtual time) and through ``serve`` in front of real fake backends on
127.0.0.1 (with a manual clock). Both must log the same decisions, in the same order.
"""

from __future__ import annotations

import asyncio
import random
from functools import partial
from typing import Any

import aiohttp
import pytest

from sessionroute.clock import ManualClock
from sessionroute.record import Recorder
from sessionroute.router import RoutingCore, choose_policy
from sessionroute.router.state import Cluster
from sessionroute.serve import RouterSettings, RunningRouter, start_router
from sessionroute.sim.events import EventQueue, VirtualClock
from sessionroute.sim.replicas import SimReplica
from sessionroute.sim.runner import replica_config
from sessionroute.sim.simulation import Simulation
from sessionroute.sim.spec import SimSpec
from sessionroute.workloads.base import Turn, TurnOutcome

from .backend import FakeBackend, start_backends

TTL_S = 100.0
STEP_S = 10.0
"""Seconds between the script's steps (every turn has finished long before the next step)."""

Step = tuple[str, Any]
SCRIPT: list[Step] = [
    ("burst", [f"s{i}" for i in range(7)]),  # first turns, all in flight at once
    ("turns", [f"s{i}" for i in range(7)]),  # second turns, one by one
    ("kill", "s0"),  # the worker holding s0 dies between turns (so it held a session)
    ("turns", [f"s{i}" for i in range(7)]),  # its sessions are refused, then re-placed
    ("release", ["s2", "s4"]),
    ("turns", ["s7", "s8"]),  # new sessions fill the freed places
    ("idle", 2 * TTL_S),  # every session expires
    ("turns", ["s0", "s5"]),  # placed as new again
]


def _turn(sid: str, n: int) -> Turn:
    prompt = 64 + 16 * n
    return Turn(sid, prompt, 4, list(range(prompt // 16)))


def _holder(log: list[tuple[str | None, str, str]], sid: str) -> str:
    """The worker of ``sid``'s latest decision in ``log``."""
    return next(w for s, w, _ in reversed(log) if s == sid)


def _simulate(urls: list[str], policy: str) -> list[tuple[str | None, str, str]]:
    """The script through the simulator's router, in virtual time."""
    spec = SimSpec.model_validate(
        {
            "workload": {"kind": "toy"},
            "replicas": {"count": len(urls), "urls": urls},
            "router": {"session_ttl_s": TTL_S},
        }
    )
    _, rcfg = replica_config(spec)
    clock = VirtualClock()
    queue = EventQueue(clock)
    choice = choose_policy(policy, session_ttl_s=TTL_S)
    replicas = [SimReplica(i, u, rcfg) for i, u in enumerate(urls)]
    log: list[tuple[str | None, str, str]] = []
    core = RoutingCore(
        choice.build(clock=clock, rng=random.Random(0)),
        Cluster(urls),
        spec.router,
        rng=random.Random(0),
        log=log,
    )
    sim = Simulation(queue, core, replicas, spec.router, Recorder(), lambda i: urls[i], rcfg)
    turns: dict[str, int] = {}
    outcomes: list[TurnOutcome] = []

    def send(sid: str) -> None:
        turns[sid] = turns.get(sid, 0) + 1
        sim.submit(_turn(sid, turns[sid]), outcomes.append)

    def burst(sids: list[str]) -> None:
        for sid in sids:
            send(sid)

    def release(sids: list[str]) -> None:
        for sid in sids:
            core.finish_session(sid)

    def kill(sid: str) -> None:
        sim.fail_replica(replicas[urls.index(_holder(log, sid))])

    t = 0.0
    for kind, arg in SCRIPT:
        t += STEP_S
        if kind == "burst":
            sim.call_at(t, partial(burst, arg))
        elif kind == "turns":
            for i, sid in enumerate(arg):
                sim.call_at(t + i, partial(send, sid))
            t += len(arg)
        elif kind == "kill":
            sim.call_at(t, partial(kill, arg))
        elif kind == "release":
            sim.call_at(t, partial(release, arg))
        elif kind == "idle":
            t += arg
    queue.run_until(t + STEP_S)
    assert all(o.ok for o in outcomes) and len(outcomes) == sum(turns.values())
    return log


async def _serve(
    backends: list[FakeBackend], policy: str
) -> tuple[list[tuple[str | None, str, str]], RunningRouter]:
    """The script through ``serve`` over HTTP, with a manual clock."""
    clock = ManualClock()
    running = await start_router(
        RouterSettings.build(
            port=0,
            worker_urls=tuple(b.url for b in backends),
            policy=policy,
            session_ttl_secs=TTL_S,
            health_check_interval_secs=3600.0,
            retry_initial_backoff_ms=1.0,
            retry_max_backoff_ms=5.0,
            shutdown_timeout_secs=1.0,
        ),
        clock=clock,
        rng=random.Random(0),
    )
    log: list[tuple[str | None, str, str]] = []
    running.router.core.log = log
    turns: dict[str, int] = {}
    async with aiohttp.ClientSession() as client:

        async def send(sid: str) -> None:
            turns[sid] = turns.get(sid, 0) + 1
            body = {"model": "m", "messages": [{"role": "user", "content": "x" * turns[sid]}]}
            headers = {"x-session-id": sid}
            async with client.post(
                running.url + "/v1/chat/completions", json=body, headers=headers
            ) as r:
                assert r.status == 200, await r.text()

        for kind, arg in SCRIPT:
            clock.advance(STEP_S)
            if kind == "burst":
                hold = asyncio.Event()
                for b in backends:
                    b.hold = hold
                sends = []
                for n, sid in enumerate(arg, 1):  # in order, each held once it arrived
                    sends.append(asyncio.create_task(send(sid)))
                    while sum(len(b.seen) for b in backends) < n:
                        await asyncio.sleep(0.002)
                hold.set()
                await asyncio.gather(*sends)
                for b in backends:
                    b.hold = None
            elif kind == "turns":
                for sid in arg:
                    await send(sid)
                    clock.advance(1.0)
            elif kind == "kill":
                holder = _holder(log, arg)
                await next(b for b in backends if b.url == holder).kill()
            elif kind == "release":
                for sid in arg:
                    async with client.post(
                        running.url + "/finish_session", params={"session_id": sid}
                    ) as r:
                        assert r.status == 200
            elif kind == "idle":
                clock.advance(arg)
    return log, running


@pytest.mark.parametrize("policy", ["sticky_least_loaded", "consistent_hash"])
async def test_the_simulator_and_serve_make_the_same_decisions(policy: str) -> None:
    backends = await start_backends(3)
    running: RunningRouter | None = None
    try:
        served, running = await _serve(backends, policy)
        simulated = _simulate([b.url for b in backends], policy)
    finally:
        if running is not None:
            await running.stop()
        for b in backends:
            await b.kill()
    assert simulated == served
    # The dead worker's sessions were tried there once (refused), then moved for good.
    dead = _holder(served[:14], "s0")
    after_kill = served[14:]
    tried = [i for i, (_, w, _) in enumerate(after_kill) if w == dead]
    assert tried, "no session was pinned to the worker that died"
    for i in tried:
        sid, _, _ = after_kill[i]
        assert after_kill[i + 1][0] == sid and after_kill[i + 1][1] != dead
    assert all(w != dead for _, w, _ in after_kill[tried[-1] + 1 :])
    if policy == "sticky_least_loaded":
        kinds = [k for _, _, k in served]
        on_dead = {sid for sid, w, _ in served[7:14] if w == dead}
        assert len(tried) == 1  # the first turn there was refused; the rest knew it was down
        assert kinds.count("repinned") == len(on_dead) >= 2
        assert kinds.count("new") == 7 + 2 + 2  # first turns, two new sessions, two expired
        first = [w for _, w, _ in served[:7]]  # the burst at an idle pool spread 3/2/2
        assert sorted(first.count(b.url) for b in backends) == [2, 2, 3]
