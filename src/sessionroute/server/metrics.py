"""Prometheus metrics of one router, in a registry of its own (no global registry state).

Counters and histograms are updated per request; gauges that mirror router state (in-flight
requests, active sessions, circuit state) and the policy's decision and session counters are
read from the routing core at scrape time by a custom collector, so they cost nothing per
request and can never drift from the state they report.

Exported (all prefixed ``sessionroute_``): ``requests_total{worker,status}``,
``in_flight{worker}``, ``active_sessions{worker}``, ``worker_available{worker}``,
``decisions_total{kind}`` (new, sticky, repinned, stateless), ``sessions_released_total``,
``sessions_expired_total``, ``retries_total{worker}``, ``circuit_state{worker}``
(0 closed, 1 open, 2 half-open), ``routing_decision_seconds`` and
``upstream_seconds{worker}`` (time to upstream response headers) histograms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sessionroute.routing import RoutingCore
from sessionroute.server.health import WorkerHealth

__all__ = ["CONTENT_TYPE", "RouterMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus text exposition format 0.0.4."""

_LATENCY_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class _StateCollector(Collector):
    def __init__(
        self, core: RoutingCore, workers: Callable[[], Mapping[str, WorkerHealth]]
    ) -> None:
        self._core = core
        self._workers = workers

    def collect(self) -> Iterator[Metric]:
        core = self._core
        urls = core.cluster.workers()
        in_flight = GaugeMetricFamily(
            "sessionroute_in_flight", "Requests in flight per worker", labels=["worker"]
        )
        sessions = GaugeMetricFamily(
            "sessionroute_active_sessions", "Sessions pinned per worker", labels=["worker"]
        )
        available = GaugeMetricFamily(
            "sessionroute_worker_available",
            "1 when the worker may receive requests (health checks pass, circuit not open)",
            labels=["worker"],
        )
        circuit = GaugeMetricFamily(
            "sessionroute_circuit_state",
            "Circuit breaker state per worker: 0 closed, 1 open, 2 half-open",
            labels=["worker"],
        )
        counts = core.policy.session_counts()
        health = self._workers()
        for url in urls:
            in_flight.add_metric([url], core.cluster.in_flight(url))
            sessions.add_metric([url], counts.get(url, 0))
            available.add_metric([url], 1.0 if core.cluster.is_healthy(url) else 0.0)
            wh = health.get(url)
            circuit.add_metric([url], int(wh.breaker.state) if wh is not None else 0)
        decisions = CounterMetricFamily(
            "sessionroute_decisions", "Routing decisions by kind", labels=["kind"]
        )
        for kind, n in core.decisions.items():
            decisions.add_metric([kind.value], n)
        stats = core.policy.session_stats()
        released = CounterMetricFamily(
            "sessionroute_sessions_released", "Sessions released by /finish_session"
        )
        released.add_metric([], stats.released)
        expired = CounterMetricFamily(
            "sessionroute_sessions_expired", "Sessions dropped after their idle TTL"
        )
        expired.add_metric([], stats.expired)
        yield from (in_flight, sessions, available, circuit, decisions, released, expired)


class RouterMetrics:
    """The metrics of one router instance.

    Args:
        core: the routing core whose state the gauges mirror.
        workers: returns the url -> :class:`WorkerHealth` map (for circuit states).
    """

    def __init__(
        self, core: RoutingCore, workers: Callable[[], Mapping[str, WorkerHealth]]
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "sessionroute_requests",
            "Proxied requests by worker and final status",
            ["worker", "status"],
            registry=self.registry,
        )
        self.retries = Counter(
            "sessionroute_retries",
            "Upstream attempts retried, by the worker that failed",
            ["worker"],
            registry=self.registry,
        )
        self.routing_seconds = Histogram(
            "sessionroute_routing_decision_seconds",
            "Time to select and reserve a worker, seconds",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.upstream_seconds = Histogram(
            "sessionroute_upstream_seconds",
            "Time from sending upstream to receiving response headers, seconds",
            ["worker"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_StateCollector(core, workers))
        self._req_children: dict[tuple[str, int], Counter] = {}
        self._up_children: dict[str, Histogram] = {}

    def count_request(self, worker: str, status: int) -> None:
        """Count one finished request (``status`` 499 when the client went away)."""
        key = (worker, status)
        child = self._req_children.get(key)
        if child is None:
            child = self._req_children[key] = self.requests.labels(worker, str(status))
        child.inc()

    def observe_upstream(self, worker: str, seconds: float) -> None:
        """Record the time to upstream response headers."""
        child = self._up_children.get(worker)
        if child is None:
            child = self._up_children[worker] = self.upstream_seconds.labels(worker)
        child.observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
