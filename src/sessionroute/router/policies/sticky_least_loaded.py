"""``sticky_least_loaded``: new sessions to the worker with the fewest active sessions, then pinned.

Semantics of vllm-router's ``sticky_least_loaded`` (vllm-project/router PR #235,
``shared/ROUTER.md``):

* a known session whose worker is healthy and whose idle time is below the TTL goes there and
  its access time is refreshed;
* otherwise it is dropped and placed as new: among healthy workers with the fewest active
  sessions, the highest ``fbi_hash("<session id>:<worker url>")`` wins (rendezvous hashing);
* a request without a session id goes to the least-loaded worker (in-flight requests), ties by
  rendezvous on its request id, and records nothing;
* idle sessions expire on revisit and in a sweep run at most every ``sweep_interval_s`` inside
  routing calls (the router may also sweep in the background).

A session moved off a failed worker stays on its new worker when the old one returns. Sessions
of a removed worker are unpinned at once and counted as re-pinned on their next turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.errors import ConfigError
from sessionroute.router.policies._rendezvous import rendezvous_winner
from sessionroute.router.policies._sessions import SessionPolicy
from sessionroute.router.policies.base import least_loaded_of
from sessionroute.router.state.cluster import ClusterView
from sessionroute.router.state.sessions import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TTL_S,
)
from sessionroute.types import RouteRequest

__all__ = ["StickyLeastLoadedConfig", "StickyLeastLoadedPolicy"]


@dataclass(frozen=True, slots=True)
class StickyLeastLoadedConfig:
    """Options of ``sticky_least_loaded``.

    Attributes:
        session_ttl_s: idle seconds before a session expires (vllm-router default 7200, env
            ``VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S``).
        sweep_interval_s: minimum seconds between sweeps run inside ``select`` (vllm-router: 60).
        max_sessions: capacity of the session table; the least recently used is evicted.
        session_table_max_bytes: capacity of the session table in estimated bytes
            (``SessionTable``'s ``max_bytes``; the router's ``RouterConfig`` gives its own).
    """

    session_ttl_s: float = DEFAULT_TTL_S
    sweep_interval_s: float = 60.0
    max_sessions: int = DEFAULT_MAX_SESSIONS
    session_table_max_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        if not self.sweep_interval_s >= 0:
            raise ConfigError(f"sweep_interval_s must be >= 0, got {self.sweep_interval_s!r}")


class StickyLeastLoadedPolicy(SessionPolicy):
    """Place new sessions by fewest active sessions (rendezvous tie-break), then keep them."""

    name: ClassVar[str] = "sticky_least_loaded"
    Config: ClassVar[type[Any] | None] = StickyLeastLoadedConfig

    def place_stateless(
        self, request: RouteRequest, healthy: tuple[str, ...], cluster: ClusterView
    ) -> str:
        """The least-loaded worker (in-flight requests), ties by rendezvous on the request id."""
        return least_loaded_of(healthy, cluster, request.request_id or "")

    def place_new(
        self, request: RouteRequest, healthy: tuple[str, ...], cluster: ClusterView
    ) -> str:
        """Among the workers with the fewest active sessions, the rendezvous winner."""
        count = self.table.count
        fewest = min(count(w) for w in healthy)
        tied = [w for w in healthy if count(w) == fewest]
        return rendezvous_winner(request.session_id or "", tied)
