"""What the parts of the router core share: the attributes :class:`~sessionroute.router.core.
RoutingCore` sets and the methods each part calls on another (:class:`CoreParts`, the base of
:class:`~sessionroute.router.admitting.AdmissionControl`,
:class:`~sessionroute.router.availability.WorkerAvailability`,
:class:`~sessionroute.router.failures.AttemptOutcomes` and
:class:`~sessionroute.router.timing.CoreTiming`). Declarations only: nothing here runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sessionroute.clock import Clock
from sessionroute.router.actions import Timers
from sessionroute.router.admission import AdmissionQueue, Ticket
from sessionroute.router.config import RouterConfig
from sessionroute.router.health import WorkerHealth
from sessionroute.router.policies.base import Policy
from sessionroute.router.ratelimit import TokenBucket
from sessionroute.router.retry import RetryPolicy
from sessionroute.router.state.cluster import Cluster
from sessionroute.types import RouteRequest

if TYPE_CHECKING:
    from sessionroute.errors import AdmissionRefused
    from sessionroute.router.core import Reservation

__all__ = ["CoreParts"]


class CoreParts:
    """The core's state and cross-part calls, declared once for its parts (module
    docstring); every attribute is set by :class:`~sessionroute.router.core.RoutingCore`."""

    policy: Policy
    cluster: Cluster
    config: RouterConfig
    clock: Clock
    timers: Timers
    health: dict[str, WorkerHealth]
    admission: AdmissionQueue
    limiter: TokenBucket | None
    retry: RetryPolicy
    on_circuit: Callable[[str, bool], None] | None
    """Called with ``(url, True)`` when a request failure opened ``url``'s circuit and
    ``(url, False)`` when successes closed it again (``serve`` logs them), or None."""
    on_unreachable: Callable[[str, str], None] | None
    """Called with ``(url, reason)`` when a refused connection (or a worker given up as hung)
    made an available worker unavailable; its health checks bring it back (``serve`` logs
    both), or None."""
    _admits_all: bool
    _recheck_set: bool
    _sick_set: bool

    if TYPE_CHECKING:

        def route(self, request: RouteRequest) -> Reservation: ...

        def complete(self, reservation: Reservation) -> bool: ...

        def retarget(self, reservation: Reservation) -> Reservation: ...

        def pump(self) -> None: ...

        def refresh(self, url: str) -> bool: ...

        def record_failure(self, url: str) -> float | None: ...

        def record_success(self, url: str) -> bool: ...

        def record_unreachable(self, url: str, reason: str) -> float | None: ...

        def recheck(self) -> None: ...

        def withdraw(self, ticket: Ticket) -> AdmissionRefused | None: ...

        def _set_recheck(self, now: float) -> None: ...

        def _sick(self) -> tuple[str, ...]: ...

        def _set_sick_recheck(self, now: float) -> None: ...
