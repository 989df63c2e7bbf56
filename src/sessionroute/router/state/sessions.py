"""The session table shared by the session-keeping policies.

Maps session id -> (worker, last access time) and keeps per-worker active-session counts, with
an idle TTL (checked on revisit and by :meth:`SessionTable.sweep`), a capacity bound (the least
recently used session is evicted when full) and lifecycle counters. Semantics follow
vllm-router's ``sticky_least_loaded`` (vllm-project/router PR #235), see ``shared/ROUTER.md``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from sessionroute.errors import ConfigError

__all__ = ["SessionInfo", "SessionStats", "SessionTable"]


class _Pin:
    """A session's worker, when it was pinned there, its last access time (seconds) and the
    turns routed there; mutable, one per pinned session."""

    __slots__ = ("first", "last", "turns", "worker")

    def __init__(self, worker: str, last: float) -> None:
        self.worker = worker
        self.first = last
        self.last = last
        self.turns = 1


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """What the router knows of one pinned session (``GET /sessions/{id}``).

    Attributes:
        worker: the worker it is pinned to.
        pinned_at: clock time (seconds) it was pinned to that worker.
        last_seen: clock time (seconds) of its last turn.
        turns: turns routed to that worker since it was pinned there (the first included).
        ttl_s: the table's idle TTL (seconds).
    """

    worker: str
    pinned_at: float
    last_seen: float
    turns: int
    ttl_s: float


@dataclass(slots=True)
class SessionStats:
    """Lifecycle counters (monotonic).

    Attributes:
        new: sessions placed for the first time (including after expiry or release).
        sticky: turns routed to their pinned worker.
        repinned: known sessions moved because their worker became unhealthy or was removed.
        expired: sessions dropped after being idle for at least the TTL.
        released: sessions dropped by ``release_session`` (``/finish_session``).
        evicted: sessions dropped because the table was at capacity.
    """

    new: int = 0
    sticky: int = 0
    repinned: int = 0
    expired: int = 0
    released: int = 0
    evicted: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "new": self.new,
            "sticky": self.sticky,
            "repinned": self.repinned,
            "expired": self.expired,
            "released": self.released,
            "evicted": self.evicted,
        }


class SessionTable:
    """Session -> worker pins with TTL, capacity and per-worker counts.

    Args:
        ttl_s: idle time in seconds after which a session expires (> 0).
        max_sessions: capacity; the least recently used session is evicted beyond it (>= 1).

    Raises:
        ConfigError: on a non-positive TTL or capacity.
    """

    __slots__ = ("_counts", "_displaced", "_max", "_pins", "stats", "ttl_s")

    def __init__(self, ttl_s: float = 7200.0, max_sessions: int = 1_000_000) -> None:
        if not ttl_s > 0:
            raise ConfigError(f"session TTL must be > 0 seconds, got {ttl_s!r}")
        if max_sessions < 1:
            raise ConfigError(f"max_sessions must be >= 1, got {max_sessions!r}")
        self.ttl_s = float(ttl_s)
        self._max = max_sessions
        # session id -> its pin (worker, last access); ordered by last access (oldest first).
        self._pins: OrderedDict[str, _Pin] = OrderedDict()
        self._counts: dict[str, int] = {}
        # Sessions unpinned because their worker was removed -> their last access time.
        self._displaced: dict[str, float] = {}
        self.stats = SessionStats()

    def __len__(self) -> int:
        return len(self._pins)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._pins

    def count(self, worker: str) -> int:
        """Active sessions pinned to ``worker``."""
        return self._counts.get(worker, 0)

    def counts(self) -> dict[str, int]:
        """A copy of worker -> active sessions (workers with zero may be absent)."""
        return {w: c for w, c in self._counts.items() if c}

    def worker_of(self, session_id: str) -> str | None:
        """The pinned worker, without touching the access time or checking the TTL."""
        entry = self._pins.get(session_id)
        return None if entry is None else entry.worker

    def info(self, session_id: str) -> SessionInfo | None:
        """The session's pin as :class:`SessionInfo` (no side effects; None if unknown)."""
        entry = self._pins.get(session_id)
        if entry is None:
            return None
        return SessionInfo(entry.worker, entry.first, entry.last, entry.turns, self.ttl_s)

    def lookup(self, session_id: str, now: float) -> str | None:
        """The pinned worker if the session is live (idle < TTL), else None.

        An expired session is dropped (its worker's count decremented) and counted as expired.
        Does not refresh the access time; call :meth:`touch` after routing.
        """
        entry = self._pins.get(session_id)
        if entry is None:
            return None
        if now - entry.last >= self.ttl_s:
            self._drop(session_id)
            self.stats.expired += 1
            return None
        return entry.worker

    def touch(self, session_id: str, now: float) -> None:
        """Refresh the access time of a pinned session (no-op if unknown)."""
        entry = self._pins.get(session_id)
        if entry is not None:
            entry.last = now
            entry.turns += 1
            self._pins.move_to_end(session_id)

    def pin(self, session_id: str, worker: str, now: float) -> None:
        """Pin ``session_id`` to ``worker`` (replacing any old pin), evicting the LRU if full."""
        self._displaced.pop(session_id, None)
        if session_id in self._pins:
            self._drop(session_id)
        while len(self._pins) >= self._max:
            oldest = next(iter(self._pins))
            self._drop(oldest)
            self.stats.evicted += 1
        self._pins[session_id] = _Pin(worker, now)
        self._counts[worker] = self._counts.get(worker, 0) + 1

    def unpin(self, session_id: str) -> str | None:
        """Drop a session without counting it anywhere; returns its worker or None."""
        if session_id not in self._pins:
            return None
        return self._drop(session_id)

    def release(self, session_id: str) -> bool:
        """Release a session (idempotent). Returns True if it was pinned."""
        self._displaced.pop(session_id, None)
        if session_id not in self._pins:
            return False
        self._drop(session_id)
        self.stats.released += 1
        return True

    def displace(self, worker: str) -> int:
        """Unpin every session of a removed ``worker``; returns how many.

        Each is remembered until its TTL runs out, so that :meth:`take_displaced` can report
        its next turn as a re-pin rather than a new session. O(sessions).
        """
        moved = [(sid, e.last) for sid, e in self._pins.items() if e.worker == worker]
        for sid, last in moved:
            self._drop(sid)
            self._displaced[sid] = float(last)
        return len(moved)

    def take_displaced(self, session_id: str, now: float) -> bool:
        """True (once) if ``session_id`` was displaced by :meth:`displace` and is still live.

        A displaced session idle for at least the TTL is forgotten and counted as expired.
        """
        last = self._displaced.pop(session_id, None)
        if last is None:
            return False
        if now - last >= self.ttl_s:
            self.stats.expired += 1
            return False
        return True

    def sweep(self, now: float, limit: int | None = None) -> int:
        """Expire every session idle for at least the TTL; returns how many expired.

        Displaced sessions (see :meth:`displace`) past the TTL are forgotten too and counted.

        Args:
            now: the clock time (seconds).
            limit: expire at most this many (the oldest first) and leave the rest to the next
                call, so a driver can spread a large expiry over several event-loop turns;
                all when None. A call that returns less than ``limit`` left none behind.
        """
        cutoff = now - self.ttl_s
        cap = len(self._pins) + len(self._displaced) if limit is None else limit
        n = 0
        if self._displaced:
            stale = []
            for sid, last in self._displaced.items():
                if last <= cutoff:
                    stale.append(sid)
                    if len(stale) >= cap:
                        break
            for sid in stale:
                del self._displaced[sid]
            n = len(stale)
        while self._pins and n < cap:
            sid, entry = next(iter(self._pins.items()))
            if entry.last > cutoff:
                break
            self._drop(sid)
            n += 1
        self.stats.expired += n
        return n

    def sessions_on(self, worker: str) -> list[str]:
        """Session ids pinned to ``worker`` (O(sessions); for admin and tests)."""
        return [sid for sid, e in self._pins.items() if e.worker == worker]

    def _drop(self, session_id: str) -> str:
        worker = self._pins.pop(session_id).worker
        c = self._counts.get(worker, 0) - 1
        if c > 0:
            self._counts[worker] = c
        else:
            self._counts.pop(worker, None)
        return worker
