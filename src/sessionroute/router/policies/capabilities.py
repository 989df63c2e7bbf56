"""Policy capabilities, as declared interfaces: a driver asks ``isinstance(policy, X)``.

A policy has a capability when it has the members of the protocol (``typing.Protocol``,
checked at run time): no driver probes a policy with ``getattr``.

* :class:`ReadsKvEvents`: routes on the replicas' KV cache events (``kv_aware``,
  ``kv_cost``): drivers feed its :attr:`~ReadsKvEvents.index` (``serve --kv-events``; the
  simulator's replica events) and may give it the view it reads
  (:meth:`~ReadsKvEvents.use_prefix_cache`).
* :class:`KeepsSessionTable`: keeps its pins in a
  :class:`~sessionroute.router.state.SessionTable` (:attr:`~KeepsSessionTable.table`), which a
  driver may replace by a shared one (several routers).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sessionroute.router.kv.index import KvIndex, PrefixCacheView
from sessionroute.router.state.sessions import SessionTable

__all__ = ["KeepsSessionTable", "ReadsKvEvents"]


@runtime_checkable
class ReadsKvEvents(Protocol):
    """A policy fed by the replicas' KV cache events."""

    index: KvIndex
    """The index the events are applied to."""

    def use_prefix_cache(self, view: PrefixCacheView) -> None:
        """Read prefix matches from ``view`` instead of :attr:`index` (the simulator gives a
        view that salts the keys as its replicas do)."""


@runtime_checkable
class KeepsSessionTable(Protocol):
    """A policy that keeps its session pins in a table."""

    table: SessionTable
    """The session table (replaceable, before routing starts)."""
