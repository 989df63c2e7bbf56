"""Committing a placement to a shared session table (``serve --state-url``), sans-I/O.

The policy decides on local objects kept in step with the shared table
(:mod:`sessionroute.router.state.shared`). A decision that pins a session (a first turn, a
re-pin: :func:`pins`) is then committed with a compare-and-set on the table's version, which
another router may have moved on since the state was loaded. :class:`PinCommit` is that
protocol for one placement: the version each attempt compares against (none on the last of
:data:`MAX_COMMIT_ATTEMPTS`, so a placement never fails because other routers keep changing
the table), and on a refusal the decision withdrawn and made again on the state the refusal
returned, so a burst of first turns spread over routers cannot herd. The driver does the
round trips (``serve``: :mod:`sessionroute.serve.state`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sessionroute.router.core import Reservation, RoutingCore
from sessionroute.router.state.shared import SharedSessionTable
from sessionroute.types import DecisionKind

__all__ = ["MAX_COMMIT_ATTEMPTS", "PinCommit", "pins"]

MAX_COMMIT_ATTEMPTS: Final = 16
"""Compare-and-set attempts of one placement; the last one pins without the version check."""


def pins(kind: DecisionKind) -> bool:
    """Whether a decision of ``kind`` writes a pin to the session table (a new session or a
    moved one); the others leave the table as it is and need no commit."""
    return kind is DecisionKind.NEW or kind is DecisionKind.REPINNED


class PinCommit:
    """The commit of one placement's pin (module docstring).

    Args:
        core: the router core that placed it.
        table: the policy's shared session table.
        reservation: the placement; its decision pins a session (:meth:`needed`).

    Attributes:
        reservation: the placement to commit now, and to forward once committed (a refusal
            replaces it); the driver releases it if the client goes away meanwhile.
        session_id: the session.
        attempt: attempts refused so far.
    """

    def __init__(
        self, core: RoutingCore, table: SharedSessionTable, reservation: Reservation
    ) -> None:
        session_id = reservation.request.session_id
        if session_id is None:
            raise ValueError("a placement without a session has no pin to commit")
        self.core = core
        self.table = table
        self.reservation = reservation
        self.session_id = session_id
        self.attempt = 0
        self._decided = table.decided_at(session_id)

    @staticmethod
    def needed(table: SharedSessionTable | None, reservation: Reservation) -> bool:
        """Whether ``reservation`` has a pin to commit: the table is shared and its decision
        pinned a session."""
        return (
            table is not None
            and reservation.request.session_id is not None
            and pins(reservation.kind)
        )

    def expected_version(self) -> int | None:
        """The table version this attempt's compare-and-set expects (the one the decision was
        made on), or None on the last attempt: pin without the check."""
        return None if self.attempt >= MAX_COMMIT_ATTEMPTS - 1 else self._decided

    def accepted(self, counts: Mapping[str, int], version: int, now: float) -> None:
        """The shared table took the pin; ``counts`` and ``version`` are its state after."""
        self.table.load(None, None, counts, version, now)

    def refused(
        self, worker: str | None, counts: Mapping[str, int], version: int, now: float
    ) -> bool:
        """The shared table refused the pin (its version moved on): take back the decision,
        take in the state the refusal returned (the session's pin ``worker``, or None; the
        counts and version) and decide again.

        Returns:
            True when the new decision pins too (commit :attr:`reservation` again); False
            when it is final (the session was pinned meanwhile: it goes there).

        Raises:
            NoWorkerAvailable: deciding again finds no worker.
        """
        table = self.table
        sid = self.session_id
        old = self.reservation
        self.core.retract(old)
        table.withdraw(sid, old.kind is DecisionKind.NEW)
        table.load(sid, worker, counts, version, now)
        self.reservation = self.core.route(old.request)
        self._decided = table.decided_at(sid)
        self.attempt += 1
        return pins(self.reservation.kind)
