"""Pure routing state: the cluster view, the session table, the routing core."""

from sessionroute.router.state.cluster import Cluster, ClusterView, WorkerState
from sessionroute.router.state.session_id import (
    DEFAULT_SESSION_HEADERS,
    VLLM_ROUTER_SESSION_HEADERS,
    extract_session_id,
)
from sessionroute.router.state.sessions import SessionStats, SessionTable

__all__ = [
    "DEFAULT_SESSION_HEADERS",
    "VLLM_ROUTER_SESSION_HEADERS",
    "Cluster",
    "ClusterView",
    "SessionStats",
    "SessionTable",
    "WorkerState",
    "extract_session_id",
]
