"""sessionroute: session-aware load balancing for multi-turn LLM inference.

Layers (imports point up): ``types``/``clock``/``errors`` -> ``router`` (sans-I/O: core,
policies, state), ``replica`` (the vLLM V1 model), ``workloads`` -> ``sim`` (virtual time),
``serve`` (HTTP), ``emulate``, ``client`` -> ``experiments`` (with ``live``) -> ``cli``.
See ``shared/DESIGN.md``.
"""

from sessionroute.native import install_guard

install_guard()  # before any compiled module is imported: stale extensions are not used

from sessionroute.clock import Clock, ManualClock, MonotonicClock
from sessionroute.errors import (
    ConfigError,
    NoWorkerAvailable,
    SessionRouteError,
    TraceFormatError,
    UnknownPolicyError,
    WorkerError,
)
from sessionroute.types import Decision, DecisionKind, EngineGauges, RouteRequest

__version__ = "0.1.0"

__all__ = [
    "Clock",
    "ConfigError",
    "Decision",
    "DecisionKind",
    "EngineGauges",
    "ManualClock",
    "MonotonicClock",
    "NoWorkerAvailable",
    "RouteRequest",
    "SessionRouteError",
    "TraceFormatError",
    "UnknownPolicyError",
    "WorkerError",
    "__version__",
]
