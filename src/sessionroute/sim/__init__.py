"""The discrete-event cluster simulator (virtual time; see ``docs/simulator.md``).

One entry point, :func:`run_simulation`, runs a :class:`SimSpec` (workload, replicas, router,
faults) under one routing policy and returns a :class:`SimResult` (metrics, time series, RL
steps). The router is :class:`sessionroute.router.core.RoutingCore` with the same policy objects the
live router drives; replicas are :class:`sessionroute.replica.Replica` models.
"""

from sessionroute.sim.events import EventQueue, VirtualClock
from sessionroute.sim.runner import SimResult, default_url, replica_config, run_simulation
from sessionroute.sim.spec import (
    FaultSection,
    ReplicaSection,
    RouterSection,
    SimOptions,
    SimSpec,
    WorkloadSection,
)

__all__ = [
    "EventQueue",
    "FaultSection",
    "ReplicaSection",
    "RouterSection",
    "SimOptions",
    "SimResult",
    "SimSpec",
    "VirtualClock",
    "WorkloadSection",
    "default_url",
    "replica_config",
    "run_simulation",
]
