"""One router, two drivers: the simulator and ``sessionroute serve`` decide alike.

Scripted event sequences run through the simulator's router (a :class:`Simulation` whose
replicas carry the backends' URLs, in virtual time) and through ``serve`` in front of real fake
backends on 127.0.0.1 (with a manual clock). Both must log the same decisions, in the same
order, and every turn must succeed in both:

* a burst of first turns at an idle pool, later turns, a worker that dies between turns (its
  sessions are refused and re-placed), a release and a new session, idle expiry;
* a worker killed while a turn is in flight there (the broken attempt is retried, as
  vllm-router retries it: refused, then placed elsewhere), and a worker that hangs with a turn
  in flight (its failed health check gives the turn up, and it is placed elsewhere).
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
from sessionroute.router.build import build_router, policy_choice
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


def _simulate(
    urls: list[str], policy: str, script: list[Step] = SCRIPT, check_every_s: float = 3600.0
) -> list[tuple[str | None, str, str]]:
    """``script`` through the simulator's router, in virtual time, with a health-check round
    every ``check_every_s`` (``serve`` runs one where the script hangs a worker)."""
    spec = SimSpec.model_validate(
        {
            "workload": {"kind": "toy"},
            "replicas": {"count": len(urls), "urls": urls},
            "router": {
                "session_ttl_s": TTL_S,
                "health_check_interval_s": check_every_s,
                "health_check_timeout_s": 1.0,
                "health_failure_threshold": 1,
            },
        }
    )
    _, rcfg = replica_config(spec)
    clock = VirtualClock()
    queue = EventQueue(clock)
    replicas = [SimReplica(i, u, rcfg) for i, u in enumerate(urls)]
    log: list[tuple[str | None, str, str]] = []
    core = build_router(  # as the simulator's runner builds it
        spec.router,
        clock,
        random.Random(0),
        choice=policy_choice(spec.router, policy),
        workers=urls,
        policy_rng=random.Random(0),
    )
    core.log = log
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

    def crash(sid: str) -> None:  # its turn is in the replica's engine when it dies
        send(sid)
        kill(sid)

    def hang(sid: str) -> None:  # its turn waits on the hung replica
        sim.hang_replica(replicas[urls.index(_holder(log, sid))])
        send(sid)

    sim.timers.start()
    t = 0.0
    for kind, arg in script:
        t += STEP_S
        if kind == "burst":
            sim.call_at(t, partial(burst, arg))
        elif kind == "turns":
            for i, sid in enumerate(arg):
                sim.call_at(t + i, partial(send, sid))
            t += len(arg)
        elif kind == "kill":
            sim.call_at(t, partial(kill, arg))
        elif kind == "crash":
            sim.call_at(t, partial(crash, arg))
        elif kind == "hang":
            sim.call_at(t, partial(hang, arg))
        elif kind == "release":
            sim.call_at(t, partial(release, arg))
        elif kind == "idle":
            t += arg
    queue.run_until(t + STEP_S)
    assert all(o.ok for o in outcomes) and len(outcomes) == sum(turns.values())
    return log


async def _serve(
    backends: list[FakeBackend], policy: str, script: list[Step] = SCRIPT
) -> tuple[list[tuple[str | None, str, str]], RunningRouter]:
    """``script`` through ``serve`` over HTTP, with a manual clock (its health checks run
    when the script says, one round each)."""
    clock = ManualClock()
    running = await start_router(
        RouterSettings.build(
            port=0,
            worker_urls=tuple(b.url for b in backends),
            policy=policy,
            session_ttl_secs=TTL_S,
            health_check_interval_secs=3600.0,
            health_failure_threshold=1,
            # a retry after a crash finds the dead backend's shutdown over (backoffs decide
            # nothing: the simulator waits its own)
            retry_initial_backoff_ms=300.0,
            retry_max_backoff_ms=1000.0,
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

        def backend_of(sid: str) -> FakeBackend:
            holder = _holder(log, sid)
            return next(b for b in backends if b.url == holder)

        async def sent_to(b: FakeBackend, sid: str) -> asyncio.Task[None]:
            """Send a turn of ``sid`` and return once ``b`` has received it."""
            n = len(b.seen)
            task = asyncio.create_task(send(sid))
            while len(b.seen) == n:
                await asyncio.sleep(0.002)
            return task

        for kind, arg in script:
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
                await backend_of(arg).kill()
            elif kind == "crash":  # dies with the turn in flight: its connection breaks
                b = backend_of(arg)
                b.hold = asyncio.Event()
                task = await sent_to(b, arg)
                await b.kill()
                await task
            elif kind == "hang":  # answers nothing, fails its checks
                b = backend_of(arg)
                b.hold = asyncio.Event()
                b.health_ok = False
                task = await sent_to(b, arg)
                health = running.router.health
                assert health is not None
                await health.check_once()  # the next round finds it: its turn is re-placed
                await task
                b.hold.set()
            elif kind == "release":
                for sid in arg:
                    async with client.post(
                        running.url + "/finish_session", params={"session_id": sid}
                    ) as r:
                        assert r.status == 200
            elif kind == "idle":
                clock.advance(arg)
    return log, running


Log = list[tuple[str | None, str, str]]


async def _both(
    policy: str, script: list[Step] = SCRIPT, check_every_s: float = 3600.0
) -> tuple[Log, Log]:
    """``script`` through ``serve`` (three fake backends) and through the simulator with the
    same URLs: both decision logs."""
    backends = await start_backends(3)
    running: RunningRouter | None = None
    try:
        served, running = await _serve(backends, policy, script)
        simulated = _simulate([b.url for b in backends], policy, script, check_every_s)
    finally:
        if running is not None:
            await running.stop()
        for b in backends:
            await b.kill()
    return served, simulated


CRASH_AND_HANG: list[Step] = [
    ("burst", [f"s{i}" for i in range(6)]),
    ("crash", "s1"),  # its worker dies while the turn is in flight there
    ("turns", [f"s{i}" for i in range(6)]),
    ("hang", "s2"),  # its worker hangs with the turn in flight and fails its check
    ("turns", [f"s{i}" for i in range(6)]),
]


@pytest.mark.parametrize("policy", ["sticky_least_loaded", "consistent_hash"])
async def test_a_crash_mid_request_and_a_hung_worker_are_decided_alike(policy: str) -> None:
    # a hung replica fails the simulator's next check, within the step
    served, simulated = await _both(policy, CRASH_AND_HANG, 2.0)
    assert simulated == served
    # s1's turn at its crashed worker, then again there (refused), then placed elsewhere;
    # s2's turn given up at its hung worker and placed elsewhere; no session stays on either
    crashed = served[6][1]
    assert served[6][0] == "s1" and served[7][0] == "s1" and served[7][1] != crashed
    hung_at = next(i for i, (sid, _, _) in enumerate(served) if i > 13 and sid == "s2")
    hung = served[hung_at][1]
    assert served[hung_at + 1][0] == "s2" and served[hung_at + 1][1] not in (hung, crashed)
    assert all(w not in (hung, crashed) for _, w, _ in served[hung_at + 1 :])


@pytest.mark.parametrize("policy", ["sticky_least_loaded", "consistent_hash"])
async def test_the_simulator_and_serve_make_the_same_decisions(policy: str) -> None:
    served, simulated = await _both(policy)
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
        assert sorted(first.count(w) for w in set(first)) == [2, 2, 3]
