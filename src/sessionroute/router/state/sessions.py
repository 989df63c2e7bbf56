"""The session table shared by the session-keeping policies.

Maps session id -> (worker, last access time) and keeps per-worker active-session counts, with
an idle TTL (checked on revisit and by :meth:`SessionTable.sweep`), a capacity bound in entries
and in estimated bytes (the least recently used session is evicted when either is reached) and
lifecycle counters. Semantics follow vllm-router's ``sticky_least_loaded``
(vllm-project/router PR #235), see ``shared/ROUTER.md``.

Removing a worker is O(1) (issue 19, no event-loop stalls): its sessions' pins are left in
place and marked stale by bumping the worker's *epoch*; a stale pin counts nowhere (not in
``len``, ``counts``, ``in``) and is dropped lazily: on the session's next turn (a re-pin,
:meth:`SessionTable.take_displaced`), by the TTL sweep (expired) or by eviction.

A policy that keeps its own per-session state beside the table (``adaptive_sticky``,
``trajectory_admission``) sets :attr:`SessionTable.on_drop` to hear of every entry the table
drops by itself (expired, evicted, dropped from a shared table's cache), so it forgets exactly
those sessions instead of scanning its state for them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sessionroute.errors import ConfigError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_TTL_S",
    "ENTRY_OVERHEAD_BYTES",
    "SessionInfo",
    "SessionStats",
    "SessionTable",
    "entry_bytes",
]

ENTRY_OVERHEAD_BYTES = 256
"""Estimated bytes of one table entry besides its session id's characters: the ordered-dict
slot, the pin tuple and its floats (~200 bytes, measured with ``tracemalloc`` on CPython 3.11)
and the id string's header (49 bytes)."""

DEFAULT_TTL_S = 7200.0
"""Default idle seconds before a pinned session expires (vllm-router's
``VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S`` default); ``RouterConfig.session_ttl_s`` and the
policies' ``session_ttl_s`` take it from here."""

DEFAULT_MAX_SESSIONS = 1_000_000
"""Default entry bound of a session table (the policies' ``max_sessions``)."""

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
"""Default byte bound of a session table (256 MiB): about 880,000 sessions with 36-character
ids, 500,000 with ids at the 256-byte limit (``RouterConfig.max_session_id_bytes``)."""


def entry_bytes(session_id: str) -> int:
    """Estimated memory of one table entry for ``session_id``, in bytes:
    :data:`ENTRY_OVERHEAD_BYTES` plus its length (an ASCII id; 4 bytes a character otherwise,
    the most CPython stores per character)."""
    n = len(session_id)
    return ENTRY_OVERHEAD_BYTES + (n if session_id.isascii() else 4 * n)


_Pin = tuple[str, float, float, int, int]
"""A session's pin: ``(worker, first, last, turns, epoch)``, its worker, when it was pinned
there and its last access (seconds), the turns routed there and the worker's epoch when pinned
(stale once the worker is removed). A plain tuple of atomic values, replaced on each turn:
CPython's cyclic garbage collector stops tracking such a tuple, so a full collection does not
traverse the pins (an object per pin cost it ~8 ms per 100,000 sessions)."""

_WORKER: Final = 0
_LAST: Final = 2
_EPOCH: Final = 4
"""Indices of a :data:`_Pin`'s fields read one at a time (the others are unpacked)."""


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

    def expires_in_s(self, now: float) -> float:
        """Seconds until the session expires if no turn comes (0 once it is due)."""
        return max(0.0, self.ttl_s - (now - self.last_seen))


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
        max_sessions: capacity in entries; the least recently used entry is evicted beyond it
            (>= 1).
        max_bytes: capacity in estimated bytes (:func:`entry_bytes` per entry); the least
            recently used entry is evicted beyond it, as for ``max_sessions`` (>= 1). Both caps
            count the entries of a removed worker's sessions until they are dropped (module
            docstring).

    Attributes:
        on_drop: called with the id of every entry the table drops by itself: expired
            (:meth:`sweep`, :meth:`lookup`), evicted (the caps), or dropped from a shared
            table's cache; not for what its caller asks (:meth:`pin` over an old pin,
            :meth:`unpin`, :meth:`release`, :meth:`take_displaced`). None: nobody listens.

    Raises:
        ConfigError: on a non-positive TTL or capacity.
    """

    __slots__ = (
        "_bytes",
        "_counts",
        "_epochs",
        "_max",
        "_max_bytes",
        "_pins",
        "_stale",
        "on_drop",
        "stats",
        "ttl_s",
    )

    def __init__(
        self,
        ttl_s: float = DEFAULT_TTL_S,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if not ttl_s > 0:
            raise ConfigError(f"session TTL must be > 0 seconds, got {ttl_s!r}")
        if max_sessions < 1:
            raise ConfigError(f"max_sessions must be >= 1, got {max_sessions!r}")
        if max_bytes < 1:
            raise ConfigError(f"the session table's byte limit must be >= 1, got {max_bytes!r}")
        self.ttl_s = float(ttl_s)
        self._max = max_sessions
        self._max_bytes = max_bytes
        # session id -> its pin (worker, last access); ordered by last access (oldest first).
        self._pins: OrderedDict[str, _Pin] = OrderedDict()
        self._counts: dict[str, int] = {}
        self._bytes = 0  # estimated bytes of every entry of _pins (entry_bytes)
        # worker -> times it was removed; a pin with an older epoch than its worker's is stale.
        self._epochs: dict[str, int] = {}
        self._stale = 0  # stale pins still in _pins
        self.stats = SessionStats()
        self.on_drop: Callable[[str], object] | None = None

    def __len__(self) -> int:
        """Live sessions (pins of removed workers not included)."""
        return len(self._pins) - self._stale

    def __contains__(self, session_id: object) -> bool:
        entry = self._pins.get(session_id)  # type: ignore[call-overload]
        return entry is not None and not self._is_stale(entry)

    @property
    def max_sessions(self) -> int:
        """The entry cap."""
        return self._max

    @property
    def max_bytes(self) -> int:
        """The byte cap (estimated bytes, :func:`entry_bytes`)."""
        return self._max_bytes

    @property
    def nbytes(self) -> int:
        """Estimated bytes of the table's entries (:func:`entry_bytes` each), stale ones
        included: what :attr:`max_bytes` bounds."""
        return self._bytes

    def count(self, worker: str) -> int:
        """Active sessions pinned to ``worker``."""
        return self._counts.get(worker, 0)

    def counts(self) -> dict[str, int]:
        """A copy of worker -> active sessions (workers with zero may be absent)."""
        return {w: c for w, c in self._counts.items() if c}

    def _is_stale(self, entry: _Pin) -> bool:
        """True when ``entry``'s worker was removed after it was pinned there."""
        epochs = self._epochs
        return bool(epochs) and entry[_EPOCH] != epochs.get(entry[_WORKER], 0)

    def worker_of(self, session_id: str) -> str | None:
        """The pinned worker, without touching the access time or checking the TTL."""
        entry = self._pins.get(session_id)
        return None if entry is None or self._is_stale(entry) else entry[_WORKER]

    def info(self, session_id: str) -> SessionInfo | None:
        """The session's pin as :class:`SessionInfo` (no side effects; None if unknown)."""
        entry = self._pins.get(session_id)
        if entry is None or self._is_stale(entry):
            return None
        worker, first, last, turns, _ = entry
        return SessionInfo(worker, first, last, turns, self.ttl_s)

    def lookup(self, session_id: str, now: float) -> str | None:
        """The pinned worker if the session is live (idle < TTL), else None.

        An expired session is dropped (its worker's count decremented) and counted as expired.
        A session of a removed worker is None here and left for :meth:`take_displaced`. Does
        not refresh the access time; call :meth:`touch` after routing.
        """
        entry = self._pins.get(session_id)
        if entry is None or (self._epochs and self._is_stale(entry)):
            return None
        if now - entry[_LAST] >= self.ttl_s:
            self._drop(session_id)
            self.stats.expired += 1
            if self.on_drop is not None:
                self.on_drop(session_id)
            return None
        return entry[_WORKER]

    def touch(self, session_id: str, now: float) -> None:
        """Refresh the access time of a pinned session (no-op if unknown)."""
        pins = self._pins
        entry = pins.get(session_id)
        if entry is not None:
            worker, first, _, turns, epoch = entry
            pins[session_id] = (worker, first, now, turns + 1, epoch)
            pins.move_to_end(session_id)

    def pin(self, session_id: str, worker: str, now: float) -> None:
        """Pin ``session_id`` to ``worker`` (replacing any old pin), evicting least recently
        used entries while the table is at its entry cap or the new entry would take it past
        its byte cap (each counted in ``stats.evicted``)."""
        if session_id in self._pins:
            self._drop(session_id)
        self._make_room(entry_bytes(session_id))
        self._cache_pin(session_id, worker, now)
        self._counts[worker] = self._counts.get(worker, 0) + 1

    def unpin(self, session_id: str) -> str | None:
        """Drop a live session without counting it anywhere; returns its worker or None."""
        entry = self._pins.get(session_id)
        if entry is None or self._is_stale(entry):
            return None
        return self._drop(session_id)

    def release(self, session_id: str) -> bool:
        """Release a session (idempotent). Returns True if it was pinned (a session of a
        removed worker is forgotten, and False)."""
        entry = self._pins.get(session_id)
        if entry is None:
            return False
        stale = self._is_stale(entry)
        self._drop(session_id)
        if stale:
            return False
        self.stats.released += 1
        return True

    def displace(self, worker: str) -> int:
        """Unpin every session of a removed ``worker`` in O(1); returns how many.

        Their entries stay, stale (module docstring), until the session's next turn
        (:meth:`take_displaced` reports it as a re-pin rather than a new session), the TTL
        sweep (expired) or eviction.
        """
        n = self._counts.pop(worker, 0)
        self._epochs[worker] = self._epochs.get(worker, 0) + 1
        self._stale += n
        return n

    def take_displaced(self, session_id: str, now: float) -> bool:
        """True (once) if ``session_id`` was displaced by :meth:`displace` and is still live.

        Its entry is dropped; one idle for at least the TTL is counted as expired.
        """
        entry = self._pins.get(session_id)
        if entry is None or not self._is_stale(entry):
            return False
        self._drop(session_id)
        if now - entry[_LAST] >= self.ttl_s:
            self.stats.expired += 1
            return False
        return True

    def sweep(self, now: float, limit: int | None = None) -> int:
        """Expire every session idle for at least the TTL; returns how many expired.

        Displaced sessions (see :meth:`displace`) past the TTL are dropped and counted too.

        Args:
            now: the clock time (seconds).
            limit: expire at most this many (the oldest first) and leave the rest to the next
                call, so a driver can spread a large expiry over several event-loop turns;
                all when None. A call that returns less than ``limit`` left none behind.
        """
        cutoff = now - self.ttl_s
        pins = self._pins
        cap = len(pins) if limit is None else limit
        on_drop = self.on_drop
        n = 0
        while pins and n < cap:
            sid, entry = next(iter(pins.items()))
            if entry[_LAST] > cutoff:
                break
            self._drop(sid)
            if on_drop is not None:
                on_drop(sid)
            n += 1
        self.stats.expired += n
        return n

    def sessions_on(self, worker: str) -> list[str]:
        """Session ids pinned to ``worker`` (O(sessions); for admin and tests)."""
        return [sid for sid, w in self.pins() if w == worker]

    def pins(self) -> list[tuple[str, str]]:
        """(session id, worker) of every live pin, least recently used first (O(sessions))."""
        stale = self._is_stale
        return [(sid, e[_WORKER]) for sid, e in self._pins.items() if not stale(e)]

    def _make_room(self, cost: int, *, cache_only: bool = False) -> None:
        """Evict least recently used entries until one more entry of ``cost`` bytes fits both
        caps: dropped and counted in ``stats.evicted``, or with ``cache_only`` (a cache of a
        shared table, :mod:`~sessionroute.router.state.shared`) only removed."""
        pins = self._pins
        while pins and (len(pins) >= self._max or self._bytes + cost > self._max_bytes):
            sid = next(iter(pins))
            if cache_only:
                self._uncache(sid)
            else:
                self._drop(sid)
                self.stats.evicted += 1
            if self.on_drop is not None:
                self.on_drop(sid)

    def _cached(self, session_id: str) -> tuple[str, bool] | None:
        """``session_id``'s entry as (its worker, whether it is stale), or None without one."""
        entry = self._pins.get(session_id)
        return None if entry is None else (entry[_WORKER], self._is_stale(entry))

    def _refresh(self, session_id: str, now: float) -> None:
        """Set the last access of ``session_id``'s entry (present) to ``now``, no turn
        counted, and make it the most recently used."""
        pins = self._pins
        worker, first, _, turns, epoch = pins[session_id]
        pins[session_id] = (worker, first, now, turns, epoch)
        pins.move_to_end(session_id)

    def _cache_pin(self, session_id: str, worker: str, now: float) -> _Pin:
        """Add an entry (not counted per worker; ``session_id`` must be absent)."""
        entry = self._pins[session_id] = (worker, now, now, 1, self._epochs.get(worker, 0))
        self._bytes += entry_bytes(session_id)
        return entry

    def _uncache(self, session_id: str) -> tuple[_Pin, bool]:
        """Remove an entry, per-worker counts untouched (KeyError if absent); returns it and
        whether it was stale."""
        entry = self._pins.pop(session_id)
        self._bytes -= entry_bytes(session_id)
        stale = self._is_stale(entry)
        if stale:
            self._stale -= 1
        return entry, stale

    def _drop(self, session_id: str) -> str:
        """Remove an entry and, when live, take it off its worker's count."""
        entry, stale = self._uncache(session_id)
        worker = entry[_WORKER]
        if not stale:
            c = self._counts.get(worker, 0) - 1
            if c > 0:
                self._counts[worker] = c
            else:
                self._counts.pop(worker, None)
        return worker
