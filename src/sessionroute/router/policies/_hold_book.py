"""The hold book of ``adaptive_hold``: the sessions it may hold, those held, and the cost.

``adaptive_hold`` (:mod:`~sessionroute.router.policies.adaptive_hold`) decides when a hold
begins and ends (its rules 4-6); the book records it. A hold (:class:`Hold`) takes a session's
context tokens out of its worker's working set until it ends. The book keeps:

* each worker's sessions in the order they were placed there (rule 4 picks whom to hold among
  them) and when each session's first turn was placed (rule 5 bounds a hold by its age);
* the holds by session and, per worker, in the order they began (the order they resume in);
* each session's seconds held in its ended holds (rule 5 bounds their sum);
* the figures the policy reports: holds, how they ended, their time, the held turns and their
  wait (:meth:`HoldBook.counters`), and which sessions were held (:meth:`HoldBook.profile`).

Times are the router clock's, in seconds.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ENDINGS", "Hold", "HoldBook"]

ENDINGS = ("resumed", "bound", "waited", "placed", "gone")
"""How a hold ends (:attr:`HoldBook.released`'s keys)."""
_SAMPLE = 20
"""Held session ids kept for the report (the first ones held)."""


class Hold:
    """One held session: its worker, the context tokens it took out of that worker's working
    set, when the hold began and the latest it ends (router clock, seconds), its place in the
    order of holds (``seq``, increasing), and when its held turn first asked to be placed
    (None while it has not)."""

    __slots__ = ("asked", "seq", "sid", "since", "tokens", "until", "worker")

    def __init__(
        self, sid: str, worker: str, tokens: int, since: float, until: float, seq: int
    ) -> None:
        self.seq = seq
        self.sid = sid
        self.worker = worker
        self.tokens = tokens
        self.since = since
        self.until = until
        self.asked: float | None = None


class HoldBook:
    """Sessions per worker, the holds in progress, and their counters (module docstring).

    ``len(book)`` is the number of sessions held now; ``sid in book`` whether ``sid`` is.

    Attributes:
        holds: holds begun. held_sessions: distinct sessions held (a session forgotten,
            :meth:`forget`, counts again when it is held again).
        released: holds ended, by how (:data:`ENDINGS`), a copy: ``"resumed"`` (the worker drained,
            in hold order), ``"bound"`` (a bound of rule 5), ``"waited"`` (its turn waited
            the queueing delay, rule 6), ``"placed"`` (the router placed the turn anyway, at
            its maximum wait or to make room in its full admission queue), ``"gone"``
            (released, expired or its worker left).
        hold_s_total: seconds of every ended hold (the sum).
        held_turns: turns that waited at the router because their session was held, and
            ``held_turn_wait_s_total`` the seconds they waited (the sum).
    """

    __slots__ = (
        "_age_total",
        "_born",
        "_by_session",
        "_by_worker",
        "_held_s",
        "_on",
        "_released",
        "_sample",
        "_tokens_total",
        "_where",
        "held_sessions",
        "held_turn_wait_s_total",
        "held_turns",
        "hold_s_total",
        "holds",
    )

    def __init__(self) -> None:
        self._on: dict[str, dict[str, None]] = {}  # worker -> its sessions, placement order
        self._where: dict[str, str] = {}  # session -> its worker in _on
        self._born: dict[str, float] = {}  # session -> when its first turn was placed
        self._by_session: dict[str, Hold] = {}
        self._by_worker: dict[str, dict[str, Hold]] = {}  # worker -> its holds, hold order
        self._held_s: dict[str, float] = {}  # session held before -> seconds of ended holds
        self._sample: list[str] = []
        self._tokens_total = 0  # context tokens of every hold when it began
        self._age_total = 0.0  # session ages of every hold when it began, seconds
        self.holds = 0
        self.held_sessions = 0
        self._released: dict[str, int] = dict.fromkeys(ENDINGS, 0)
        self.hold_s_total = 0.0
        self.held_turns = 0
        self.held_turn_wait_s_total = 0.0

    # -- the sessions on each worker --------------------------------------------------------
    def place(self, sid: str, worker: str, now: float) -> None:
        """A turn of ``sid`` was placed on ``worker`` at ``now``: it is listed there (last,
        when it came from another worker), and its first turn was placed at ``now`` unless
        one was before."""
        if self._where.get(sid) != worker:
            self._unlist(sid)
            self._where[sid] = worker
            self._on.setdefault(worker, {})[sid] = None
        self._born.setdefault(sid, now)

    def members(self, worker: str) -> dict[str, None] | None:
        """``worker``'s sessions in placement order (as dict keys), or None before one."""
        return self._on.get(worker)

    def born(self, sid: str) -> float | None:
        """When ``sid``'s first turn was placed (None: not known)."""
        return self._born.get(sid)

    def _unlist(self, sid: str) -> None:
        """Take ``sid`` off its worker's list (it moved, or is gone)."""
        w = self._where.pop(sid, None)
        if w is not None:  # _where and _on change together: sid is listed on w
            self._on[w].pop(sid, None)

    def remove_worker(self, worker: str) -> None:
        """``worker`` left: its list goes (end its holds first)."""
        for sid in self._on.pop(worker, {}):
            self._where.pop(sid, None)

    # -- the holds --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._by_session)

    def __contains__(self, sid: object) -> bool:
        return sid in self._by_session

    def get(self, sid: str) -> Hold | None:
        """``sid``'s hold in progress, or None."""
        return self._by_session.get(sid)

    def queue(self, worker: str) -> dict[str, Hold] | None:
        """``worker``'s holds in hold order (session id -> hold), or None when it holds
        none. The book's own dict: ending a hold takes it out (and the dict stays empty once
        its last hold ended), so copy it to end holds while iterating."""
        return self._by_worker.get(worker)

    def holding(self, worker: str) -> bool:
        """Whether ``worker`` holds any session."""
        return worker in self._by_worker

    def held_s(self, sid: str) -> float:
        """Seconds ``sid`` was held in its ended holds (0 for a session not held before)."""
        return self._held_s.get(sid, 0.0)

    def held(self) -> dict[str, Hold]:
        """Session id -> its hold, for the sessions held now (a copy)."""
        return dict(self._by_session)

    def begin(self, sid: str, worker: str, tokens: int, now: float, until: float) -> Hold:
        """Hold ``sid`` on ``worker`` from ``now`` to at most ``until``: it took ``tokens``
        context tokens out of the working set. The caller checks that ``sid`` is not held
        already."""
        hold = Hold(sid, worker, tokens, now, until, self.holds)
        self._by_session[sid] = hold
        self._by_worker.setdefault(worker, {})[sid] = hold
        self.holds += 1
        self._tokens_total += tokens
        self._age_total += now - self._born.get(sid, now)
        if sid not in self._held_s:
            self._held_s[sid] = 0.0
            self.held_sessions += 1
            if len(self._sample) < _SAMPLE:
                self._sample.append(sid)
        return hold

    def end(self, hold: Hold, how: str, now: float) -> None:
        """End ``hold`` at ``now`` (``how``: one of :data:`ENDINGS`); a hold past its bound
        ended at the bound (its turn was admitted from then on). The caller gives its tokens
        back to the working set."""
        sid = hold.sid
        del self._by_session[sid]
        queue = self._by_worker[hold.worker]
        del queue[sid]
        if not queue:
            del self._by_worker[hold.worker]
        held = min(now, hold.until) - hold.since
        self._held_s[sid] += held  # begin entered sid; forget, which drops it, comes after
        self._released[how] += 1
        self.hold_s_total += held
        if hold.asked is not None:
            self.held_turns += 1
            self.held_turn_wait_s_total += now - hold.asked

    def forget(self, sid: str) -> None:
        """``sid`` is gone (end its hold first): take it off its worker's list, drop when it
        began and its held seconds."""
        self._unlist(sid)
        self._born.pop(sid, None)
        self._held_s.pop(sid, None)

    # -- the report ------------------------------------------------------------------------
    @property
    def released(self) -> dict[str, int]:
        """Holds ended, by how (class docstring): a copy, so a caller cannot move the book's
        counts."""
        return dict(self._released)

    def counters(self) -> dict[str, Any]:
        """Holds begun, distinct sessions held, sessions held now, holds ended by how, their
        seconds, held turns and their wait (seconds rounded to ms)."""
        return {
            "holds": self.holds,
            "held_sessions": self.held_sessions,
            "held_now": len(self._by_session),
            "released": dict(self._released),
            "hold_s_total": round(self.hold_s_total, 3),
            "held_turns": self.held_turns,
            "held_turn_wait_s_total": round(self.held_turn_wait_s_total, 3),
        }

    def profile(self) -> dict[str, Any]:
        """Which sessions were held: their mean context tokens and age (seconds since their
        first turn was placed) when a hold began, and the first ids held."""
        n = self.holds
        return {
            "held_context_mean": round(self._tokens_total / n, 1) if n else 0.0,
            "held_age_mean_s": round(self._age_total / n, 3) if n else 0.0,
            "held_sample": list(self._sample),
        }
