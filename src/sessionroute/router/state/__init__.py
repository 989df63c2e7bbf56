"""Pure routing state: the cluster view and the session table."""

from sessionroute.router.state.cluster import Cluster, ClusterView, WorkerState
from sessionroute.router.state.sessions import SessionStats, SessionTable

__all__ = [
    "Cluster",
    "ClusterView",
    "SessionStats",
    "SessionTable",
    "WorkerState",
]
