"""One simulated turn in flight, across its router attempts and client retries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from sessionroute.replica import key_list
from sessionroute.router.admission import Ticket
from sessionroute.router.core import Reservation
from sessionroute.sim.replicas import SimReplica
from sessionroute.workloads.base import Turn, TurnOutcome

__all__ = [
    "ADMISSION",
    "BACKOFF",
    "CANCELLED",
    "DELIVER",
    "DONE",
    "ENGINE",
    "ROUTED",
    "InFlight",
]

ROUTED: Final = 0
"""Placed; travelling to its replica."""
ENGINE: Final = 1
"""In its replica's engine."""
BACKOFF: Final = 2
"""Waiting for a retry (the router's, with a reservation; or the client's, without)."""
DELIVER: Final = 3
"""Finished; its response travels to the client."""
DONE: Final = 4
"""Delivered."""
CANCELLED: Final = 5
"""Cancelled by the workload."""
ADMISSION: Final = 6
"""Waiting in the router's admission queue."""


class InFlight:
    """One turn in flight (across retries).

    Attributes:
        handle: the host's handle of the turn.
        turn: the turn.
        keys: its block keys as a list (for the ideal cache and the replica alike).
        on_done: the workload's callback.
        sent_s: when the client first sent it (simulated seconds).
        attempt: attempts of the current router request (1-based once placed).
        tries: attempts in all (they number the request ids).
        client_tries: times the client sent the turn again after a 502/503.
        ticket: its admission ticket while it waits for admission.
        state: one of the module's state constants.
        hit: tokens an infinite cache would have hit (the ideal bound).
        rid: the current attempt's request id.
        res: the current reservation, or None.
        rep: the current attempt's replica, or None.
        out: the response, between finish and delivery.
    """

    __slots__ = (
        "attempt",
        "client_tries",
        "handle",
        "hit",
        "keys",
        "on_done",
        "out",
        "rep",
        "res",
        "rid",
        "sent_s",
        "state",
        "ticket",
        "tries",
        "turn",
    )

    def __init__(
        self, handle: int, turn: Turn, on_done: Callable[[TurnOutcome], None], now: float
    ) -> None:
        self.handle = handle
        self.turn = turn
        self.keys = key_list(turn.block_keys)
        self.on_done = on_done
        self.sent_s = now
        self.attempt = 0
        self.tries = 0
        self.client_tries = 0
        self.ticket: Ticket | None = None
        self.state = ROUTED
        self.hit = 0
        self.rid = ""
        self.res: Reservation | None = None
        self.rep: SimReplica | None = None
        self.out: TurnOutcome | None = None
