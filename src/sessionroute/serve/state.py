"""Shared routing state on Redis: several routers, one session table (``--state-url``).

The design (``docs/router.md``, "Several routers, one session table"): the policy decides
synchronously on local objects (:mod:`sessionroute.router.state.shared`) that this module
keeps in step with Redis around each decision:

* :meth:`RedisState.load`, before ``core.place``: one script call (one round trip) touches
  the session's pin, returns it with every worker's session count, the table's version and
  the other routers' in-flight sums, and writes this router's in-flight lease;
* :meth:`RedisState.commit`, after it, only when the decision pinned a session (a first turn,
  a re-pin): a compare-and-set on the version. A refusal (another router changed the table
  since the load) withdraws the decision and decides again on the state the refusal returned,
  so a burst of first turns spread over routers cannot herd (the protocol is the core's,
  :class:`~sessionroute.router.commit.PinCommit`; this module does its round trips). A later
  turn of a known session costs one round trip, a first turn two.

In-flight counts are leases: each router writes its own per-worker counts with every load and
every ``lease_s / 3`` seconds; a router that dies stops renewing them and they expire after
``lease_s``. Redis unreachable: requests keep flowing on the local objects (the last loaded
counts plus this router's changes; the table is marked ``offline``, so the policy places a
session this router has not seen by rendezvous, as every other router does), a warning is
logged, ``sessionroute_state_up`` is 0 and a background task reconnects every
``reconnect_s``; on reconnection, releases made meanwhile are replayed and the pins placed
meanwhile claimed where Redis has none and the session was not released lately (all cached
pins when Redis lost its data). No request fails because of Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Iterator
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from sessionroute.clock import Clock
from sessionroute.errors import ConfigError
from sessionroute.router.commit import MAX_COMMIT_ATTEMPTS, PinCommit
from sessionroute.router.core import Reservation, RoutingCore
from sessionroute.router.state.sessions import DEFAULT_MAX_SESSIONS
from sessionroute.router.state.shared import SharedCluster, SharedSessionTable
from sessionroute.serve import scripts
from sessionroute.serve.redislink import RedisLink
from sessionroute.serve.released import listen_for_releases
from sessionroute.serve.tasks import cancel_and_wait
from sessionroute.types import RouteRequest

__all__ = ["RELEASE_MEMORY_S", "RedisState", "check_state_url"]

log = logging.getLogger("sessionroute.serve.state")

_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
"""What an unreachable or failing Redis raises through redis-py."""

RELEASE_MEMORY_S = 60.0
"""Seconds Redis remembers a release (to twice that): a pin written back after Redis lost its
data is refused for a session released meanwhile. Routers reconnect within ``reconnect_s``
(1 s by default) of Redis' return; a router that was away from Redis longer than this may
write back a pin released meanwhile (it expires by the session TTL)."""

_BATCH = 500
"""Commands per pipeline when replaying releases and claiming pins after a reconnection."""


def check_state_url(url: str) -> str:
    """``url`` if it is a Redis URL (``redis://``, ``rediss://`` or ``unix://``).

    Raises:
        ConfigError: for anything else, naming the URL.
    """
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(
            f"--state-url must be a Redis URL (redis://HOST:PORT/DB, rediss://..., unix://...), "
            f"got {url!r}"
        )
    return url


class RedisState:
    """This router's link to the shared state (module docstring).

    Args:
        url: Redis URL (``redis://HOST:PORT/DB``).
        core: the routing core; its cluster must be a :class:`SharedCluster`.
        table: the policy's shared session table, or None for a policy without sessions
            (then only in-flight counts are shared).
        clock: the router's clock (local cache access times).
        prefix: key prefix; routers share state when they share URL and prefix.
        lease_s: seconds a router's in-flight counts outlive its last renewal.
        timeout_s: socket timeout of every Redis call (then the call counts as a failure).
        reconnect_s: seconds between reconnection attempts while Redis is unreachable.
        router_id: this router's id in the lease set (random when omitted).
    """

    def __init__(
        self,
        url: str,
        core: RoutingCore,
        table: SharedSessionTable | None,
        clock: Clock,
        *,
        prefix: str = "sessionroute",
        lease_s: float = 10.0,
        timeout_s: float = 0.5,
        reconnect_s: float = 1.0,
        router_id: str | None = None,
    ) -> None:
        cluster = core.cluster
        if not isinstance(cluster, SharedCluster):
            raise TypeError("RedisState needs a core whose cluster is a SharedCluster")
        self.url = check_state_url(url)
        self.core = core
        self.cluster: SharedCluster = cluster
        self.table = table
        self.clock = clock
        self.router_id = router_id or secrets.token_hex(8)
        self.lease_s = lease_s
        self.reconnect_s = reconnect_s
        tag = "{" + prefix + "}:"
        self.keys = [tag + k for k in ("pins", "last", "counts", "version", "routers", "releases")]
        self.lease_prefix = tag + "lease:"
        self.channel = tag + "released"
        """Pub/sub channel of released session ids: every router drops its cached pin, so a
        router never writes back a pin released through another one (after Redis lost its
        data); a router that missed the message is refused by Redis (:data:`RELEASE_MEMORY_S`)."""
        ttl_s = table.ttl_s if table is not None else core.config.session_ttl_s
        self._ttl_ms = str(int(ttl_s * 1000))
        self._lease_ms = str(max(1, int(lease_s * 1000)))
        self._memory_ms = str(int(RELEASE_MEMORY_S * 1000))
        self._heard_ms = 0  # Redis' time (ms) of the latest release :meth:`_catch_up` read
        self._max = str(table.max_sessions if table is not None else DEFAULT_MAX_SESSIONS)
        self.link = RedisLink(url, timeout_s)
        self.timeout_s = timeout_s
        self._sha: dict[str, str] = {}
        self.up = False
        self.epoch: str | None = None
        """The id of the Redis data set this router last connected to (a random token each
        router sets if missing): a different one after a reconnection means Redis lost its
        data (restarted without persistence, flushed)."""
        self._lost = False
        self._placing = asyncio.Lock()
        self._dirty: set[str] = set()
        self._released: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._reconnect: asyncio.Task[None] | None = None
        self._settled: asyncio.TimerHandle | None = None
        self.errors = 0
        self.conflicts = 0
        self.reconnects = 0
        self.round_trips = 0

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect and load the shared counts; with Redis unreachable, start on local state
        and keep trying in the background (the router starts either way)."""
        try:
            await self._sync()
            self.up = True
            log.info("shared state at %s (router id %s)", self.url, self.router_id)
        except _ERRORS as exc:
            log.warning(
                "shared state at %s unreachable at start (%s: %s); routing on local state, "
                "reconnecting every %.1f s",
                self.url, type(exc).__name__, exc, self.reconnect_s,
            )  # fmt: skip
            self._down(exc)
        self._tasks.append(asyncio.create_task(self._renew_loop(), name="sessionroute-lease"))
        self._tasks.append(asyncio.create_task(self._watch_loop(), name="sessionroute-watch"))
        if self.table is not None:
            listen = listen_for_releases(
                self.url, self.channel, self.table.forget, self.timeout_s, self.reconnect_s
            )
            self._tasks.append(asyncio.create_task(listen, name="sessionroute-released"))

    async def close(self) -> None:
        """Stop the background tasks and hand the lease back (this router's in-flight counts
        leave the shared view at once rather than when the lease expires)."""
        tasks = [*self._tasks, *([self._reconnect] if self._reconnect else [])]
        await cancel_and_wait(tasks)
        self._tasks = []
        self._reconnect = None
        if self._settled is not None:
            self._settled.cancel()
        if self.up:
            with contextlib.suppress(*_ERRORS):
                await asyncio.gather(
                    self.link.call("DEL", self.lease_prefix + self.router_id),
                    self.link.call("ZREM", self.keys[4], self.router_id),
                )
        await self.link.close()

    # -- hot path ---------------------------------------------------------------------------
    async def load(self, request: RouteRequest) -> None:
        """Bring the state ``request``'s decision reads in from Redis (one round trip; nothing
        while Redis is unreachable)."""
        if not self.up:
            return
        sid = request.session_id
        try:
            reply = await self._script("LOAD", *self._load_args(sid))
        except _ERRORS as exc:
            self._down(exc)
            return
        self.round_trips += 1
        self._apply_load(sid, reply)

    async def commit(self, reservation: Reservation) -> Reservation:
        """Commit the pin ``reservation``'s decision made, or decide again until the shared
        table takes one (:class:`~sessionroute.router.commit.PinCommit`); returns the
        reservation to forward.

        Raises:
            NoWorkerAvailable: when deciding again finds no worker (none is healthy any more).
        """
        table = self.table
        if table is None or not PinCommit.needed(table, reservation):
            return reservation
        commit = PinCommit(self.core, table, reservation)
        try:
            async with self._placing:
                return await self._commit(commit)
        except asyncio.CancelledError:  # the client went away: release what it holds
            self.core.complete(commit.reservation)
            raise

    async def _commit(self, commit: PinCommit) -> Reservation:
        """:meth:`commit`'s round trips, under the placement lock: one placement in flight
        per router, so the compare-and-set only ever races other routers' placements."""
        sid = commit.session_id
        for _ in range(MAX_COMMIT_ATTEMPTS):
            reservation = commit.reservation
            if not self.up:
                self._dirty.add(sid)
                return reservation
            version = commit.expected_version()
            if version is None:
                log.warning(
                    "session %r pinned without the version check: the shared table "
                    "kept changing under %d attempts",
                    sid,
                    commit.attempt,
                )
            want = "" if version is None else str(version)
            try:
                reply = await self._script(
                    "PIN", sid, reservation.worker, want, self._max, self._ttl_ms
                )
            except _ERRORS as exc:
                self._down(exc)
                self._dirty.add(sid)
                return reservation
            self.round_trips += 1
            ok, cur, now_version, counts = reply
            if reservation.done:  # answered meanwhile (client gone): nothing to forward
                return reservation
            if ok:
                commit.accepted(_pairs(counts), int(now_version), self.clock.now())
                return reservation
            self.conflicts += 1
            if not commit.refused(cur or None, _pairs(counts), int(now_version), self.clock.now()):
                return commit.reservation  # the session was pinned meanwhile: it goes there
        return commit.reservation  # pragma: no cover - the last attempt never compares

    async def finish(self, session_id: str) -> None:
        """Release ``session_id`` in the shared table (replayed after a reconnection when
        Redis is unreachable now)."""
        if not self.up:
            self._released.add(session_id)
            return
        try:
            await self._script("RELEASE", session_id, self.channel, self._memory_ms)
        except _ERRORS as exc:
            self._down(exc)
            self._released.add(session_id)

    async def sweep(self) -> int:
        """Expire the shared table's idle sessions (any router may sweep); returns how many."""
        if not self.up:
            return 0
        try:
            n = await self._script("SWEEP", self._ttl_ms, 10_000)
        except _ERRORS as exc:
            self._down(exc)
            return 0
        return int(n)

    # -- internals ------------------------------------------------------------------------
    def _load_args(self, sid: str | None) -> list[str | int]:
        args: list[str | int] = [
            sid or "",
            self._ttl_ms,
            self._lease_ms,
            self.router_id,
            self.lease_prefix,
        ]
        for url, n, tokens in self.cluster.local_load():
            args += ("i:" + url, n, "t:" + url, tokens)
        return args

    def _apply_load(self, sid: str | None, reply: list[Any]) -> None:
        pin, version, counts, remote, _expired = reply
        in_flight: dict[str, int] = {}
        tokens: dict[str, int] = {}
        for key, value in _pairs(remote).items():
            (in_flight if key[0] == "i" else tokens)[key[2:]] = value
        self.cluster.set_remote(in_flight, tokens)
        if self.table is not None:
            self.table.load(sid, pin or None, _pairs(counts), int(version), self.clock.now())

    def _script(self, name: str, *args: str | int) -> Any:
        """Run script ``name`` of :mod:`~sessionroute.serve.scripts` (an awaitable reply)."""
        return self.link.call("EVALSHA", self._sha[name], len(self.keys), *self.keys, *args)

    async def _sync(self) -> None:
        """Connect if needed (loading the scripts), then load the shared state."""
        if not self.link.connected:
            await self.link.connect()
            names = ("LOAD", "PIN", "RELEASE", "SWEEP")
            shas = await asyncio.gather(
                *(self.link.call("SCRIPT", "LOAD", getattr(scripts, n)) for n in names)
            )
            self._sha = dict(zip(names, shas, strict=True))
            key = self.keys[0].replace(":pins", ":epoch")
            _, epoch = await asyncio.gather(
                self.link.call("SET", key, secrets.token_hex(8), "NX"), self.link.call("GET", key)
            )
            if self.epoch is not None and epoch != self.epoch:
                # _lost: sticky until a replay wrote every cached pin back (one that failed
                # is retried on a data set whose epoch this router has seen by then)
                self._lost = True
                self._heard_ms = 0  # a new memory of releases, timed by the new server's clock
            self.epoch = epoch
            if self._lost and self.up:  # the lease renewal reconnected: replay as when down
                raise RedisConnectionError("the shared state lost its data (a new epoch)")
        reply = await self._script("LOAD", *self._load_args(None))
        self._apply_load(None, reply)
        if self.table is not None:
            await self._catch_up(self.table)

    async def _catch_up(self, table: SharedSessionTable) -> None:
        """Drop the cached pins of the sessions released since the last call (Redis' memory of
        releases, :data:`RELEASE_MEMORY_S`): the releases the channel did not bring (this
        router was not subscribed when they were published, e.g. replayed by another router
        just after Redis came back). A pin left cached would be written back at the next loss
        of Redis' data, when Redis no longer remembers the release."""
        key = self.keys[5]
        reply = await self.link.call("ZRANGEBYSCORE", key, self._heard_ms, "+inf", "WITHSCORES")
        # RESP3 answers [member, score] pairs, RESP2 a flat list
        flat = (
            [x for pair in reply for x in pair] if reply and isinstance(reply[0], list) else reply
        )
        for i in range(0, len(flat), 2):
            table.forget(str(flat[i]))
            self._heard_ms = max(self._heard_ms, int(float(flat[i + 1])))

    async def _watch_loop(self) -> None:
        """Drop the link when Redis stops answering (see :meth:`RedisLink.check`)."""
        while True:
            await asyncio.sleep(self.timeout_s / 2)
            self.link.check()

    async def _release_all(self, sids: list[str]) -> None:
        for batch in _chunks(sids):
            await asyncio.gather(
                *(self._script("RELEASE", sid, self.channel, self._memory_ms) for sid in batch)
            )

    async def _renew_loop(self) -> None:
        """Renew the lease (and refresh the other routers' counts) every ``lease_s / 3``."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            if self.up:
                try:
                    await self._sync()
                except _ERRORS as exc:
                    self._down(exc)

    def _set_offline(self, offline: bool) -> None:
        """Tell the table whether the shared state is unreachable (the policy then places
        unseen sessions by rendezvous, alike on every router). Back online, the table stays
        offline for ``2 * reconnect_s`` more: the other routers reconnect up to
        ``reconnect_s`` later and place by rendezvous until then, so this one does too."""
        if self._settled is not None:
            self._settled.cancel()
            self._settled = None
        if self.table is None:
            return
        if offline:
            self.table.offline = True
        else:
            table = self.table
            self._settled = asyncio.get_running_loop().call_later(
                2 * self.reconnect_s, lambda: setattr(table, "offline", not self.up)
            )

    def _down(self, exc: BaseException) -> None:
        self.errors += 1
        if not self.up and self._reconnect is not None:
            return
        if self.up:
            log.warning(
                "shared state at %s unreachable (%s: %s); routing on local state, "
                "reconnecting every %.1f s",
                self.url, type(exc).__name__, exc, self.reconnect_s,
            )  # fmt: skip
        self.up = False
        self._set_offline(True)
        self.cluster.set_remote(None)
        self._reconnect = asyncio.create_task(self._reconnect_loop(), name="sessionroute-redis")

    async def _reconnect_loop(self) -> None:
        while True:
            await asyncio.sleep(self.reconnect_s)
            try:
                await self._resync()
            except _ERRORS:
                self.errors += 1
                continue
            self.up = True
            self._set_offline(False)
            self.reconnects += 1
            self._reconnect = None
            log.warning("shared state at %s reachable again", self.url)
            return

    async def _resync(self) -> None:
        """Replay what happened while Redis was unreachable, then load its state (calls are
        pipelined on the link, a batch at a time). Releases and placements made while this
        runs (the router is still offline) are replayed too, until none is left: the caller
        marks the link up with no await in between, so none is missed."""
        self.link.reset()  # a fresh connection, with the scripts loaded again
        await self._sync()
        everything = self._lost  # Redis lost its data: claim every cached pin, once
        while True:
            released, self._released = sorted(self._released), set()
            dirty, self._dirty = self._dirty, set()
            try:
                await self._replay(released, dirty, everything)
                await self._sync()
            except BaseException:
                self._released.update(released)
                self._dirty.update(dirty)
                raise
            everything = self._lost = False
            if not self._released and not self._dirty:
                return

    async def _replay(self, released: list[str], dirty: set[str], everything: bool) -> None:
        """Release ``released`` (Redis remembers them: a router that reconnects later and
        writes back the pin it cached, having missed the message, is refused), then claim the
        pins of ``dirty`` (of every cached session when ``everything``) where Redis has none."""
        await self._release_all(released)
        table = self.table
        if table is None:
            return
        claims = (
            table.pins()
            if everything
            else [(s, w) for s in sorted(dirty) if (w := table.worker_of(s))]
        )
        for batch in _chunks(claims):
            await asyncio.gather(
                *(
                    self._script("PIN", sid, w, "absent", self._max, self._ttl_ms)
                    for sid, w in batch
                )
            )
        if claims and everything:
            log.warning("shared state had lost its data: %d cached pin(s) restored", len(claims))


def _pairs(flat: list[Any]) -> dict[str, int]:
    """A flat [key, value, ...] reply as a dict of ints."""
    return {flat[i]: int(flat[i + 1]) for i in range(0, len(flat), 2)}


def _chunks(items: list[Any]) -> Iterator[list[Any]]:
    for i in range(0, len(items), _BATCH):
        yield items[i : i + _BATCH]
