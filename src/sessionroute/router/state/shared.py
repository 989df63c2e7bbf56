"""Session table and cluster view for several routers that share one authoritative state.

With ``sessionroute serve --state-url redis://...`` the session pins, the per-worker session
counts and every router's in-flight counts live in Redis (:mod:`sessionroute.serve.state`).
Policies stay synchronous, pure state machines that read a
:class:`~sessionroute.router.state.SessionTable` and a
:class:`~sessionroute.router.state.ClusterView`; the two classes here are those, kept in step
with the shared state *around* each synchronous decision:

1. before a request is placed, the driver loads the shared state that decision reads (the
   session's pin, every worker's session count, the table's version, the other routers'
   in-flight counts) into the local objects (:meth:`SharedSessionTable.load`,
   :meth:`SharedCluster.set_remote`);
2. the unchanged policy decides on them, in one synchronous call, as with local state;
3. a decision that changed the table (a new pin or a re-pin) is committed only if the table's
   version is still the one it was decided on (compare-and-set in one server-side script);
   otherwise it is withdrawn (:meth:`SharedSessionTable.withdraw`), the fresh state loaded
   and the decision taken again. So select + reserve stays atomic across routers.

The local pins are a cache of the shared ones for the sessions this router has seen; the
counts the policy reads are the shared counts (:meth:`SharedSessionTable.count`), not counts of
the local cache. When the shared state is unreachable, the same objects keep working on what
they last loaded plus this router's own changes (:meth:`SharedCluster.set_remote` with
nothing clears the other routers' in-flight counts).

In the simulator (virtual time, no I/O) several routers share state by sharing one
:class:`~sessionroute.router.state.SessionTable` and one
:class:`~sessionroute.router.state.Cluster` object; see :mod:`sessionroute.sim.routers`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sessionroute.router.state.cluster import Cluster
from sessionroute.router.state.sessions import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TTL_S,
    SessionTable,
    entry_bytes,
)

__all__ = ["SharedCluster", "SharedSessionTable", "share_table"]


class SharedSessionTable(SessionTable):
    """A :class:`SessionTable` whose counts are the shared table's (see the module docstring).

    ``count``/``counts``/``len`` report every router's sessions as last loaded plus this
    router's changes since; lookups, TTL, touch and pins work on the local cache as in the base
    class. ``version`` is the shared table's version the counts were loaded at (-1 before the
    first load). ``offline`` is True while the shared state is unreachable (its driver sets
    it): session policies then place the sessions this router has not seen by rendezvous over
    the healthy workers, so every router places them alike without the shared table
    (:meth:`sessionroute.router.policies._sessions.SessionPolicy.select`).
    """

    __slots__ = ("_decided", "offline", "version")

    def __init__(
        self,
        ttl_s: float = DEFAULT_TTL_S,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        super().__init__(ttl_s, max_sessions, max_bytes)
        self.version = -1
        self.offline = False
        self._decided: dict[str, int] = {}

    def pin(self, session_id: str, worker: str, now: float) -> None:
        """As :meth:`SessionTable.pin`; remembers the version the pin was decided at (see
        :meth:`decided_at`)."""
        super().pin(session_id, worker, now)
        self._decided[session_id] = self.version

    def decided_at(self, session_id: str) -> int:
        """The version of the state the last pin of ``session_id`` was decided on (forgotten
        once asked; -1 when unknown): what its commit compares against."""
        return self._decided.pop(session_id, -1)

    def __len__(self) -> int:
        """Live sessions in the shared table (the sum of the counts)."""
        return sum(self._counts.values())

    def load(
        self, session_id: str | None, worker: str | None, counts: Mapping[str, int], version: int,
        now: float,
    ) -> None:  # fmt: skip
        """Take the shared state in: ``session_id``'s pin (``worker``, None when it has none),
        every worker's session count and the table's version.

        A pin from the shared table replaces the cached one with ``now`` as its access time (its
        TTL is checked by the shared table); a session the shared table no longer has is
        dropped from the cache. Counts are replaced, not added to.
        """
        if session_id is not None:
            self._decided.pop(session_id, None)
            cached = self._cached(session_id)
            if cached is not None and (cached[1] or worker is None or cached[0] != worker):
                self._uncache(session_id)
                cached = None
                if self.on_drop is not None:
                    self.on_drop(session_id)
            if worker is not None and cached is None:
                self._make_room(entry_bytes(session_id), cache_only=True)
                self._cache_pin(session_id, worker, now)
            elif cached is not None:
                self._refresh(session_id, now)
        self._counts = {w: c for w, c in counts.items() if c > 0}
        self.version = version

    def forget(self, session_id: str) -> bool:
        """Drop ``session_id``'s cached pin, counts untouched (another router released it:
        the shared counts already lost it); True if it was cached."""
        if session_id not in self._pins:
            return False
        self._uncache(session_id)
        self._decided.pop(session_id, None)
        if self.on_drop is not None:
            self.on_drop(session_id)
        return True

    def withdraw(self, session_id: str, new: bool) -> None:
        """Undo a pin the shared table refused (its version moved on): drop it from the cache
        and from the counter it was added to (``new``: stats.new, else stats.repinned)."""
        self.unpin(session_id)
        if new:
            self.stats.new -= 1
        else:
            self.stats.repinned -= 1


class SharedCluster(Cluster):
    """A :class:`Cluster` whose load signals add the other routers' in-flight counts.

    ``in_flight``/``in_flight_tokens`` are this router's reservations (as in the base class)
    plus what the other routers reported at the last load (:meth:`set_remote`).
    """

    __slots__ = ("remote", "remote_tokens")

    def __init__(self, urls: tuple[str, ...] | list[str] = ()) -> None:
        super().__init__(urls)
        self.remote: dict[str, int] = {}
        self.remote_tokens: dict[str, int] = {}

    def in_flight(self, url: str) -> int:
        return super().in_flight(url) + self.remote.get(url, 0)

    def in_flight_tokens(self, url: str) -> int:
        return super().in_flight_tokens(url) + self.remote_tokens.get(url, 0)

    def local_load(self) -> list[tuple[str, int, int]]:
        """(worker, in-flight requests, in-flight tokens) reserved by this router."""
        return [(url, w.in_flight, w.in_flight_tokens) for url, w in self._workers.items()]

    def set_remote(
        self, in_flight: Mapping[str, int] | None = None, tokens: Mapping[str, int] | None = None
    ) -> None:
        """The other routers' in-flight requests and tokens per worker (None: unknown, zero)."""
        self.remote = dict(in_flight) if in_flight else {}
        self.remote_tokens = dict(tokens) if tokens else {}


def share_table(policy: Any) -> SharedSessionTable | None:
    """Give a session-keeping policy a :class:`SharedSessionTable` (same TTL and capacity) as
    its session table, before its first decision; the policy's code is unchanged (it reads
    ``policy.table`` as before).

    Returns:
        The new table; None for a policy without a :class:`SessionTable` (then only in-flight
        counts are shared).
    """
    old = getattr(policy, "table", None)
    if not isinstance(old, SessionTable):
        return None
    table = SharedSessionTable(old.ttl_s, old.max_sessions, old.max_bytes)
    table.on_drop = old.on_drop
    policy.table = table
    return table
