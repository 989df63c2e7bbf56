"""Route receipts (``--route-receipts``): why each proxied request went where it went.

With the flag, every proxied response carries one header::

    x-sessionroute-route: policy=sticky_least_loaded; worker=http://10.0.0.2:8000;
        reason=sticky; session=abc; origin=x-session-id; wait_ms=0.000

(one line), and the same record goes, as one JSON object per line, to
``--route-receipts-log PATH`` (``-``: standard error) when given::

    {"ts": 1767000000.123, "request_id": "chatcmpl-...", "policy": "sticky_least_loaded",
     "worker": "http://10.0.0.2:8000", "reason": "sticky", "session_id": "abc",
     "origin": "x-session-id", "wait_ms": 0.0, "status": 200}

``reason`` is the router core's decision kind: ``new`` (a session's first placement),
``sticky`` (its pinned worker), ``repinned`` (moved after its worker failed or expired),
``moved`` (moved by the policy for load), ``stateless`` (no session). ``wait_ms`` is the time
the request waited in the router's admission queue (held by the policy or by the rate limit);
``queued`` is true when it waited there at all. Receipts are matched to responses by request id
(``x-request-id``), so two concurrent requests that send the same id may swap receipts.

Off by default, and then free: the router core's decision hook is None and the proxy checks
one boolean it already checked for ``--expose-worker-header``.
"""

from __future__ import annotations

import json
import sys
import time
from collections import OrderedDict
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from sessionroute.router.core import Reservation, RoutingCore

__all__ = ["RECEIPT_HEADER", "Receipts"]

RECEIPT_HEADER = b"x-sessionroute-route"
"""The receipt's response header."""

PENDING_MAX = 65536
"""Placed requests whose receipt waits for their response (the oldest is dropped past it)."""


class Receipts:
    """Collects decisions from the router core and writes them out with the responses.

    Args:
        core: the router core (its ``on_decision`` hook is set here).
        log_path: where JSON lines go (``-``: standard error), or None for none.
    """

    def __init__(self, core: RoutingCore, log_path: str | None) -> None:
        self._policy = core.policy.name
        self._origins = core.requests.origins
        self._pending: OrderedDict[str, Reservation] = OrderedDict()
        self._out: IO[str] | None = sys.stderr if log_path == "-" else None
        self._path = log_path if log_path and log_path != "-" else None
        """The log file, opened at the first receipt (a router built only to check its
        settings opens nothing)."""
        self._own = False
        self.written = 0
        """Receipts written (headers)."""
        core.on_decision = self.decided

    def decided(self, reservation: Reservation) -> None:
        """The core's decision hook: keep the reservation until its response is relayed."""
        rid = reservation.request.request_id
        if rid is None:  # (live requests always have one)
            return
        pending = self._pending
        pending[rid] = reservation
        if len(pending) > PENDING_MAX:
            pending.popitem(last=False)

    def header_lines(self, worker: str, raw_rid: bytes, status: int = 0) -> bytes:
        """The receipt header line for the response to request ``raw_rid`` from ``worker``
        (the worker alone when the decision is unknown), and its JSON line."""
        rid = raw_rid.decode("utf-8", "replace")
        res = self._pending.pop(rid, None)
        self.written += 1
        if res is None:
            return (
                RECEIPT_HEADER
                + b": policy="
                + self._policy.encode()
                + b"; worker="
                + (worker.encode() + b"\r\n")
            )
        req = res.request
        sid = req.session_id
        origin = (self._origins.get(sid) or req.session_header) if sid is not None else None
        wait_ms = round(res.waited_s * 1000.0, 3)
        parts = [f"policy={self._policy}", f"worker={worker}", f"reason={res.kind.value}"]
        if sid is not None:
            parts.append(f"session={_quote(sid)}")
            parts.append(f"origin={origin}")
        parts.append(f"wait_ms={wait_ms:.3f}")
        if self._out is None and self._path is not None:
            self._out = open(self._path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            self._own = True
        if self._out is not None:
            record = {
                "ts": round(time.time(), 3),
                "request_id": rid,
                "policy": self._policy,
                "worker": worker,
                "reason": res.kind.value,
                "session_id": sid,
                "origin": origin,
                "wait_ms": wait_ms,
                "queued": res.waited_s > 0,
                "status": status,
            }
            self._out.write(json.dumps(record, separators=(",", ":")) + "\n")
        line = "; ".join(parts)
        return RECEIPT_HEADER + b": " + line.encode("utf-8", "replace") + b"\r\n"

    def close(self) -> None:
        """Close the log file (when the router opened one)."""
        if self._own and self._out is not None:
            self._out.close()
        self._out = None
        self._path = None


def _quote(value: str) -> str:
    """A header-safe rendering of a session id (no ``;``, no control characters)."""
    if all(c.isascii() and c.isprintable() and c not in ';"' for c in value):
        return value
    return json.dumps(value)
