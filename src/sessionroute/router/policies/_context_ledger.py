"""The context tokens of a policy's pinned sessions, per worker, with no O(sessions) pass.

``adaptive_sticky`` weighs workers by the context its pinned sessions hold there. This ledger
keeps one entry per session (its worker, the tokens it counts, its last turn, its last move)
and the per-worker sums, and does all its upkeep in time proportional to the sessions it
touches, never to all of them (issue 19: no event-loop stalls):

* **a removed worker** is forgotten in O(1): its sum goes at once and its sessions' entries go
  stale (the worker's *generation* moved on, as :class:`~sessionroute.router.state.
  SessionTable` marks pins with an epoch); a stale entry counts nowhere and is replaced on the
  session's next turn or dropped when the session is forgotten;
* **idle sessions** stop counting in last-turn order: the entries whose tokens count are kept
  oldest turn first, so :meth:`ContextLedger.idle_pass` visits only those that went idle, at
  most ``limit`` per call;
* **sessions the session table drops by itself** (expired, evicted) are forgotten one by one
  as it drops them (``SessionTable.on_drop``).
"""

from __future__ import annotations

import math
from collections import OrderedDict

__all__ = ["ContextLedger", "LedgerEntry"]


class LedgerEntry:
    """One pinned session: its worker, the context tokens it counts in that worker's sum (its
    latest prompt estimate; 0 while idle), its last turn and its last move (seconds), and the
    worker's generation when it was pinned there."""

    __slots__ = ("gen", "last", "moved_at", "tokens", "worker")

    def __init__(self, worker: str, tokens: int, now: float, gen: int) -> None:
        self.worker = worker
        self.tokens = tokens
        self.last = now
        self.moved_at = -math.inf
        self.gen = gen


class ContextLedger:
    """Per-worker context tokens of pinned sessions (module docstring).

    Attributes:
        context: worker -> context tokens of its live pinned sessions (absent when none); read
            it, do not write it.
        total: context tokens over all workers.
    """

    __slots__ = ("_counted", "_entries", "_gen", "context", "total")

    def __init__(self) -> None:
        self._entries: dict[str, LedgerEntry] = {}
        # entries that may count tokens, oldest last turn first (the idle pass reads the front)
        self._counted: OrderedDict[str, LedgerEntry] = OrderedDict()
        self._gen: dict[str, int] = {}  # worker -> times it was removed
        self.context: dict[str, int] = {}
        self.total = 0

    def __len__(self) -> int:
        """Entries held, stale ones included."""
        return len(self._entries)

    def live(self, entry: LedgerEntry) -> bool:
        """Whether ``entry``'s worker was not removed since it was pinned there."""
        gen = self._gen
        return not gen or entry.gen == gen.get(entry.worker, 0)

    def get(self, sid: str) -> LedgerEntry | None:
        """The live entry of ``sid``, or None (unknown, or its worker was removed)."""
        entry = self._entries.get(sid)
        return entry if entry is not None and self.live(entry) else None

    def track(self, sid: str, worker: str, tokens: int, now: float) -> LedgerEntry:
        """Pin ``sid`` to ``worker`` with ``tokens`` of context, replacing any entry it had
        (keeping its last move when that entry was live)."""
        old = self.forget(sid)
        entry = self._entries[sid] = LedgerEntry(worker, tokens, now, self._gen.get(worker, 0))
        if old is not None:
            entry.moved_at = old.moved_at
        self._counted[sid] = entry
        self._add(worker, tokens)
        return entry

    def turn(self, sid: str, entry: LedgerEntry, tokens: int, now: float) -> None:
        """A later turn of live ``entry``: its context is now ``tokens``, its last turn now."""
        self.resize(entry, tokens)
        entry.last = now
        counted = self._counted
        counted[sid] = entry
        counted.move_to_end(sid)

    def resize(self, entry: LedgerEntry, tokens: int) -> None:
        """Count ``tokens`` for live ``entry`` instead of its present tokens."""
        if tokens != entry.tokens:
            self._add(entry.worker, tokens - entry.tokens)
            entry.tokens = tokens

    def move(self, entry: LedgerEntry, target: str, now: float) -> None:
        """Move live ``entry`` (and its tokens) to ``target`` at time ``now``."""
        self._add(entry.worker, -entry.tokens)
        self._add(target, entry.tokens)
        entry.worker = target
        entry.gen = self._gen.get(target, 0)
        entry.moved_at = now

    def forget(self, sid: str) -> LedgerEntry | None:
        """Drop ``sid``'s entry; returns it when it was live (its tokens no longer count)."""
        entry = self._entries.pop(sid, None)
        if entry is None:
            return None
        self._counted.pop(sid, None)
        if not self.live(entry):
            return None
        self._add(entry.worker, -entry.tokens)
        return entry

    def remove_worker(self, worker: str) -> None:
        """``worker`` left: its sum goes now, its entries go stale (O(1))."""
        self._gen[worker] = self._gen.get(worker, 0) + 1
        self.total -= self.context.pop(worker, 0)

    def idle_pass(self, idle_before: float, limit: int | None = None) -> bool:
        """Stop counting the tokens of sessions whose last turn is at or before
        ``idle_before`` (counted again on their next turn), oldest first, at most ``limit``
        of them (all when None); returns whether more are left for another call."""
        counted = self._counted
        n = len(counted) if limit is None else limit
        while counted:
            sid, entry = next(iter(counted.items()))
            if entry.last > idle_before:
                return False
            if n <= 0:
                return True
            n -= 1
            del counted[sid]
            if entry.tokens and self.live(entry):
                self.resize(entry, 0)
        return False

    def _add(self, worker: str, tokens: int) -> None:
        self.total += tokens
        v = self.context.get(worker, 0) + tokens
        if v > 0:
            self.context[worker] = v
        else:
            self.context.pop(worker, None)
