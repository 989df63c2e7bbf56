"""Several routers, one session table on a real Redis (``--state-url``): routers over HTTP,
fake aiohttp backends, a redis-server child on a free loopback port."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp

from sessionroute.bench.backend import free_port
from sessionroute.router.state.shared import SharedCluster, SharedSessionTable
from sessionroute.serve import RunningRouter
from sessionroute.serve.state import RedisState
from sessionroute.types import DecisionKind, RouteRequest

from .backend import FakeBackend
from .conftest import MakeRouter, post_chat
from .redis_server import RedisServer


def _worker_of(backends: list[FakeBackend]) -> dict[str, set[int]]:
    """session id -> indices of the backends that served it."""
    out: dict[str, set[int]] = {}
    for i, b in enumerate(backends):
        for sid in b.sessions():
            if sid is not None:
                out.setdefault(sid, set()).add(i)
    return out


async def _shared(make_router: MakeRouter, urls: list[str], redis: RedisServer) -> RunningRouter:
    return await make_router(urls, state_url=redis.url, policy="sticky_least_loaded")


async def _both_see(
    make_router: MakeRouter,
    backends: list[FakeBackend],
    redis: RedisServer,
    client: aiohttp.ClientSession,
    prefix: str,
    n: int,
) -> tuple[RunningRouter, RunningRouter]:
    """Two routers on ``redis``; sessions ``<prefix>0..n-1`` answered through both."""
    urls = [b.url for b in backends]
    a = await _shared(make_router, urls, redis)
    b = await _shared(make_router, urls, redis)
    for k in range(n):
        assert (await post_chat(client, a, f"{prefix}{k}"))[0] == 200
        assert (await post_chat(client, b, f"{prefix}{k}"))[0] == 200
    return a, b


async def _release_through(
    client: aiohttp.ClientSession, router: RunningRouter, prefix: str, n: int
) -> None:
    for k in range(n):
        async with client.post(router.url + f"/finish_session?session_id={prefix}{k}") as resp:
            assert resp.status == 200


async def test_a_session_opened_through_router_a_continues_through_router_b(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    urls = [b.url for b in backends]
    a = await _shared(make_router, urls, redis_server)
    b = await _shared(make_router, urls, redis_server)
    for k in range(12):
        assert (await post_chat(client, a, f"s{k}"))[0] == 200
        for _ in range(3):
            assert (await post_chat(client, b, f"s{k}"))[0] == 200
    placed = _worker_of(backends)
    assert len(placed) == 12
    assert all(len(ws) == 1 for ws in placed.values()), placed
    assert b.router.core.decisions[DecisionKind.STICKY] == 36
    assert b.router.core.decisions[DecisionKind.NEW] == 0
    assert a.router.core.decisions[DecisionKind.NEW] == 12


async def test_sixty_new_sessions_over_two_routers_split_evenly(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    urls = [b.url for b in backends]
    routers = [await _shared(make_router, urls, redis_server) for _ in range(2)]
    # A concurrent burst of first turns, alternating routers: select + reserve must be atomic
    # across them or two routers pick the same least-loaded worker from the same counts.
    statuses = await asyncio.gather(
        *(post_chat(client, routers[k % 2], f"burst-{k}") for k in range(60))
    )
    assert [s for s, _ in statuses] == [200] * 60
    per_backend = [len(set(b.sessions())) for b in backends]
    assert per_backend == [20, 20, 20]
    for r in routers:
        assert r.router.state is not None
        await r.router.state.load(RouteRequest(session_id="probe"))
        assert dict(r.router.core.policy.session_counts()) == dict.fromkeys(urls, 20)
    assert sum(r.router.core.decisions[DecisionKind.NEW] for r in routers) == 60


async def test_router_restart_moves_no_session(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    urls = [b.url for b in backends]
    a = await _shared(make_router, urls, redis_server)
    for k in range(30):
        assert (await post_chat(client, a, f"r{k}"))[0] == 200
    before = _worker_of(backends)
    await a.stop()
    a2 = await _shared(make_router, urls, redis_server)
    for k in range(30):
        for _ in range(2):
            assert (await post_chat(client, a2, f"r{k}"))[0] == 200
    after = _worker_of(backends)
    assert after == before  # every later turn on its session's first worker
    assert all(len(ws) == 1 for ws in after.values())
    assert a2.router.core.decisions[DecisionKind.NEW] == 0
    assert a2.router.core.decisions[DecisionKind.STICKY] == 60


async def test_redis_killed_mid_run_fails_no_request_and_reconnects(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    urls = [b.url for b in backends]
    a = await _shared(make_router, urls, redis_server)
    b = await _shared(make_router, urls, redis_server)
    statuses: list[int] = []
    for k in range(10):
        statuses.append((await post_chat(client, a, f"k{k}"))[0])
    redis_server.kill()
    # b notices first, so it reconnects first and writes the empty Redis before a does: a
    # must still see that Redis lost its data (a new epoch) and restore every pin it holds.
    for k in range(10):  # known sessions and new ones, through both routers
        statuses.append((await post_chat(client, b, f"new{k}"))[0])
        statuses.append((await post_chat(client, b, f"new{k}"))[0])
        statuses.append((await post_chat(client, a, f"k{k}"))[0])
    assert statuses == [200] * 40
    assert a.router.state is not None and not a.router.state.up
    async with client.get(a.url + "/metrics") as resp:
        text = await resp.text()
    assert "sessionroute_state_up 0.0" in text
    # Redis comes back empty: each router restores the pins it holds.
    redis_server.start()
    deadline = time.monotonic() + 10
    while not (a.router.state.up and b.router.state is not None and b.router.state.up):
        assert time.monotonic() < deadline, "routers did not reconnect"
        await asyncio.sleep(0.05)
    for k in range(10):  # sessions only a knew continue through b on the same worker
        assert (await post_chat(client, b, f"k{k}"))[0] == 200
        assert (await post_chat(client, a, f"new{k}"))[0] == 200
    placed = _worker_of(backends)
    assert all(len(ws) == 1 for ws in placed.values()), placed
    assert a.router.state.reconnects == 1


async def test_while_redis_is_away_two_routers_place_a_new_session_alike(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    a, b = await _both_see(make_router, backends, redis_server, client, "", 0)
    for k in range(6):  # uneven counts before the outage: a and b last loaded different ones
        assert (await post_chat(client, a if k % 3 else b, f"old{k}"))[0] == 200
    redis_server.kill()
    for k in range(12):  # each new session's turns alternate between the routers
        for router in (a, b, a, b):
            assert (await post_chat(client, router, f"new{k}"))[0] == 200
    placed = _worker_of(backends)
    assert all(len(placed[f"new{k}"]) == 1 for k in range(12)), placed
    assert len({w for k in range(12) for w in placed[f"new{k}"]}) > 1  # not all on one


async def test_a_dead_routers_in_flight_counts_are_reclaimed(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    urls = [b.url for b in backends]
    hold = asyncio.Event()
    for be in backends:
        be.hold = hold
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sessionroute.cli",
            "serve",
            "--port",
            str(port),
            "--worker-urls",
            *urls,
            "--state-url",
            redis_server.url,
            "--state-lease-secs",
            "1",
            "--log-level",
            "warning",
            "--health-check-interval-secs",
            "3600",
            "--scrape-interval-secs",
            "0",
        ],
        env={**os.environ},
    )
    b = await _shared(make_router, urls, redis_server)
    assert isinstance(b.router.core.cluster, SharedCluster)
    cluster = b.router.core.cluster
    pending: list[asyncio.Task[object]] = []
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                async with client.get(url + "/liveness") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, "router A did not start"
            await asyncio.sleep(0.1)

        async def send(k: int) -> object:
            with_timeout = aiohttp.ClientTimeout(total=30)
            async with client.post(
                url + "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                headers={"x-session-id": f"d{k}"},
                timeout=with_timeout,
            ) as resp:
                return resp.status

        pending = [asyncio.ensure_future(send(k)) for k in range(4)]
        assert b.router.state is not None
        deadline = time.monotonic() + 10
        while sum(cluster.remote.values()) != 4:  # b sees a's 4 requests in flight
            assert time.monotonic() < deadline, cluster.remote
            await b.router.state.load(RouteRequest())
            await asyncio.sleep(0.05)
        assert sum(cluster.in_flight(u) for u in urls) == 4
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        while sum(cluster.remote.values()) != 0:  # its lease expires: nothing leaks
            assert time.monotonic() - killed < 5, cluster.remote
            await b.router.state.load(RouteRequest())
            await asyncio.sleep(0.05)
        assert sum(cluster.in_flight(u) for u in urls) == 0
        # its pins stay: the sessions it placed continue through b
        hold.set()
        await asyncio.gather(*pending, return_exceptions=True)
        table = b.router.core.policy.table  # type: ignore[attr-defined]
        assert isinstance(table, SharedSessionTable)
        assert len(table) == 4
    finally:
        hold.set()
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        for t in pending:
            t.cancel()
    assert Counter(len(set(be.sessions())) for be in backends).total() == 3


async def test_one_router_on_redis_places_exactly_as_with_local_state(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    urls = [b.url for b in backends]

    async def run(router: RunningRouter) -> list[int]:
        placed = []
        for k in range(24):
            for _ in range(2):
                assert (await post_chat(client, router, f"p{k}"))[0] == 200
                placed.append(next(i for i, b in enumerate(backends) if b.seen[-1:]))
                for b in backends:
                    b.seen.clear()
            if k % 3 == 0:  # finished sessions free their worker's count
                async with client.post(router.url + f"/finish_session?session_id=p{k}") as r:
                    assert r.status == 200
        return placed

    local = await make_router(urls, policy="sticky_least_loaded")
    expected = await run(local)
    await local.stop()
    shared = await _shared(make_router, urls, redis_server)
    assert await run(shared) == expected
    assert shared.router.state is not None and shared.router.state.conflicts == 0


async def test_a_router_starts_and_serves_with_redis_unreachable(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    r = await make_router([b.url for b in backends], state_url=url)
    assert r.router.state is not None and not r.router.state.up
    for k in range(5):
        assert (await post_chat(client, r, f"u{k}"))[0] == 200
        assert (await post_chat(client, r, f"u{k}"))[0] == 200
    assert all(len(ws) == 1 for ws in _worker_of(backends).values())
    assert r.router.state.errors >= 1


def test_state_url_must_be_a_redis_url() -> None:
    import pytest

    from sessionroute.errors import ConfigError
    from sessionroute.serve import RouterSettings

    with pytest.raises(ConfigError, match=r"--state-url: .*redis://HOST:PORT/DB"):
        RouterSettings.build(state_url="http://127.0.0.1:6379")


async def test_finish_session_on_any_router_releases_it_everywhere(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    a, b = await _both_see(make_router, backends, redis_server, client, "f", 6)
    await _release_through(client, b, "f", 3)  # opened through a, released through b
    assert a.router.state is not None
    await a.router.state.load(RouteRequest())
    assert sum(a.router.core.policy.session_counts().values()) == 3
    new_before = a.router.core.decisions[DecisionKind.NEW]
    assert (await post_chat(client, a, "f0"))[0] == 200  # a knew f0: it is a new session now
    assert a.router.core.decisions[DecisionKind.NEW] == new_before + 1
    assert (await post_chat(client, a, "f4"))[0] == 200  # f4 was not released: still sticky
    assert a.router.core.decisions[DecisionKind.NEW] == new_before + 1


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def _pins(state: RedisState) -> list[str]:
    """The ids of the sessions Redis pins, sorted."""
    return sorted(await state.link.call("HKEYS", state.keys[0]))


async def _alone_when_redis_dies(
    make_router: MakeRouter,
    backends: list[FakeBackend],
    redis: RedisServer,
    client: aiohttp.ClientSession,
    prefix: str,
) -> tuple[RunningRouter, RedisState]:
    """One router on ``redis`` with sessions ``<prefix>0..2``; then Redis is killed and the
    router has noticed (a later turn of ``<prefix>0``)."""
    router = await _shared(make_router, [b.url for b in backends], redis)
    state = router.router.state
    assert state is not None
    for k in range(3):
        assert (await post_chat(client, router, f"{prefix}{k}"))[0] == 200
    redis.kill()
    assert (await post_chat(client, router, f"{prefix}0"))[0] == 200
    assert not state.up
    return router, state


async def test_a_session_released_through_b_is_not_written_back_by_a_after_redis_loses_it(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    a, b = await _both_see(make_router, backends, redis_server, client, "r", 4)
    assert a.router.state is not None and b.router.state is not None
    sa, sb = a.router.state, b.router.state
    await _release_through(client, b, "r", 2)
    table = sa.table
    assert table is not None
    await _until(lambda: table.worker_of("r0") is None, "a kept the released pin cached")
    assert table.worker_of("r1") is None and table.worker_of("r2") is not None
    redis_server.kill()
    for k in range(2, 4):  # each router notices the loss
        assert (await post_chat(client, a, f"r{k}"))[0] == 200
        assert (await post_chat(client, b, f"r{k}"))[0] == 200
    redis_server.start()
    await _until(lambda: sa.up and sb.up, "routers did not reconnect")
    assert await _pins(sa) == ["r2", "r3"]  # the live ones written back, the released ones not


async def test_redis_refuses_to_write_back_a_session_released_lately(
    redis_server: RedisServer,
) -> None:
    """The scripts themselves: a router that missed a release's message (not subscribed yet
    after Redis came back) and writes its cached pin back is refused."""
    import redis.asyncio as aioredis

    from sessionroute.serve import scripts

    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    keys = ["{t}:" + k for k in ("pins", "last", "counts", "version", "routers", "releases")]

    async def run(script: str, *args: str | int) -> Any:
        return await client.eval(script, len(keys), *keys, *args)

    try:
        assert (await run(scripts.PIN, "s", "w1", "", 100, 60_000))[0] == 1
        assert await run(scripts.RELEASE, "s", "chan", 60_000) == 1
        ok, cur, _, counts = await run(scripts.PIN, "s", "w1", "absent", 100, 60_000)
        assert (ok, cur, counts) == (0, "", [])
        assert await client.hget(keys[0], "s") is None
        assert (await run(scripts.PIN, "t", "w1", "absent", 100, 60_000))[0] == 1  # never released
        # the same id placed again is a live session: a later write-back of it is taken
        assert (await run(scripts.PIN, "s", "w2", "", 100, 60_000))[0] == 1
        await client.hdel(keys[0], "s")
        assert (await run(scripts.PIN, "s", "w2", "absent", 100, 60_000))[0] == 1
        # releases are remembered for the memory given, then trimmed
        await run(scripts.RELEASE, "u", "chan", 1)
        await asyncio.sleep(0.01)
        await run(scripts.RELEASE, "v", "chan", 1)
        assert await client.zscore(keys[5], "u") is None
    finally:
        await client.aclose()


async def test_a_release_made_while_the_router_reconnects_is_replayed_too(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    """A release that reaches the router while it replays (still offline: it waits in the
    replay set) is replayed before the link is up again, not dropped with the set."""
    a, state = await _alone_when_redis_dies(make_router, backends, redis_server, client, "q")
    replay = state._replay

    async def replay_then_release(released: list[str], dirty: set[str], everything: bool) -> None:
        await replay(released, dirty, everything)  # q0..q2 written back
        if everything:  # a client releases q1 now, while the router is still offline
            async with client.post(a.url + "/finish_session?session_id=q1") as resp:
                assert resp.status == 200

    state._replay = replay_then_release  # type: ignore[method-assign]
    redis_server.start()
    await _until(lambda: state.up, "the router did not reconnect")
    assert await _pins(state) == ["q0", "q2"]


async def test_a_session_released_through_b_while_redis_is_away_is_not_written_back_by_a(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    a, b = await _both_see(make_router, backends, redis_server, client, "w", 4)
    assert a.router.state is not None and b.router.state is not None
    sa, sb = a.router.state, b.router.state
    redis_server.kill()
    for k in range(4):  # each router notices the loss
        assert (await post_chat(client, a, f"w{k}"))[0] == 200
        assert (await post_chat(client, b, f"w{k}"))[0] == 200
    assert not sa.up and not sb.up
    await _release_through(client, b, "w", 2)  # b replays them when Redis is back
    assert sa.table is not None and sa.table.worker_of("w0") is not None  # a cannot know
    redis_server.start()
    await _until(lambda: sa.up and sb.up, "routers did not reconnect")
    assert await _pins(sa) == ["w2", "w3"]


async def test_a_release_a_router_did_not_hear_is_caught_up_before_redis_loses_its_data(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    """A router that missed a release's message (here: its subscription cancelled) drops the
    pin at its next sync from Redis' memory of releases, so it does not write it back when
    Redis later loses its data (and with it that memory)."""
    a, b = await _both_see(make_router, backends, redis_server, client, "c", 3)
    assert a.router.state is not None and b.router.state is not None
    sa, sb = a.router.state, b.router.state
    for task in sa._tasks:
        if task.get_name() == "sessionroute-released":
            task.cancel()
    await _release_through(client, b, "c", 1)
    table = sa.table
    assert table is not None and table.worker_of("c0") is not None  # a did not hear it
    await sa._sync()  # every lease_s / 3 in the background
    assert table.worker_of("c0") is None and table.worker_of("c1") is not None
    redis_server.kill()
    redis_server.start()
    for k in range(1, 3):  # each router notices the loss and writes its pins back
        assert (await post_chat(client, a, f"c{k}"))[0] == 200
        assert (await post_chat(client, b, f"c{k}"))[0] == 200
    await _until(lambda: sa.up and sb.up, "routers did not reconnect")
    assert await _pins(sa) == ["c1", "c2"]


async def test_cached_pins_are_restored_when_the_first_replay_after_a_loss_fails(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    """Redis lost its data and the replay that writes the cached pins back fails once (a
    timeout, Redis away again): the next attempt, which finds the data set it already saw,
    still writes every cached pin back."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    _, state = await _alone_when_redis_dies(make_router, backends, redis_server, client, "f")
    replay = state._replay
    failed: list[bool] = []

    async def fail_once(released: list[str], dirty: set[str], everything: bool) -> None:
        if not failed:
            failed.append(everything)
            raise RedisConnectionError("Redis away again")
        await replay(released, dirty, everything)

    state._replay = fail_once  # type: ignore[method-assign]
    redis_server.start()
    await _until(lambda: state.up, "the router did not reconnect")
    assert failed == [True]
    assert await _pins(state) == ["f0", "f1", "f2"]


async def test_a_quiet_router_writes_its_pins_back_when_its_lease_renewal_finds_redis_lost_them(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    """Redis restarts (its data lost) while no request reaches the router: the background
    renewal that reconnects finds the new data set and the router writes its pins back, as
    a request noticing the loss would have made it do."""
    urls = [b.url for b in backends]
    a = await _shared(make_router, urls, redis_server)
    state = a.router.state
    assert state is not None
    for k in range(3):
        assert (await post_chat(client, a, f"g{k}"))[0] == 200
    redis_server.kill()
    redis_server.start()
    await _until(lambda: state.reconnects >= 1 and state.up, "the loss went unnoticed")
    assert await _pins(state) == ["g0", "g1", "g2"]


async def test_a_router_reads_the_releases_of_a_new_data_set_from_its_start(
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    """After Redis lost its data, its memory of releases starts afresh, timed by the new
    server's clock (another host's, maybe behind the old one's): a router reads it from its
    start, not from the last release time it read of the old data set."""
    a, b = await _both_see(make_router, backends, redis_server, client, "h", 2)
    assert a.router.state is not None and b.router.state is not None
    sa, sb = a.router.state, b.router.state
    for task in sa._tasks:  # a hears no message: only the memory tells it
        if task.get_name() == "sessionroute-released":
            task.cancel()
    seconds, _ = await sa.link.call("TIME")
    # the last release a read of the old data set, stamped by a clock an hour ahead
    sa._heard_ms = int(seconds) * 1000 + 3_600_000
    redis_server.kill()
    redis_server.start()
    for k in range(2):  # each router notices the loss and writes its pins back
        assert (await post_chat(client, a, f"h{k}"))[0] == 200
        assert (await post_chat(client, b, f"h{k}"))[0] == 200
    await _until(lambda: sa.up and sb.up, "routers did not reconnect")
    await _release_through(client, b, "h", 1)
    table = sa.table
    assert table is not None and table.worker_of("h0") is not None  # a did not hear it
    await sa._sync()  # every lease_s / 3 in the background
    assert table.worker_of("h0") is None and table.worker_of("h1") is not None
