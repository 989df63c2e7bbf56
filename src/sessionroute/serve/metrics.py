"""Prometheus metrics of one router, in a registry of its own (no global registry state).

Per-request counters and histograms are plain counts updated on the event loop and exported by
a custom collector; gauges that mirror router state (in-flight requests, active sessions,
circuit state) and the policy's decision and session counters are read from the routing core
at scrape time, so they cost nothing per request and can never drift from the state they
report.

Exported (all prefixed ``sessionroute_``): ``requests_total{worker,status}``,
``in_flight{worker}``, ``active_sessions{worker}``, ``worker_available{worker}``,
``decisions_total{kind}`` (new, sticky, repinned, stateless), ``sessions_released_total``,
``sessions_expired_total``, ``sessions_evicted_total``, ``session_table_bytes`` (estimated),
``retries_total{worker}``, ``circuit_state{worker}``
(0 closed, 1 open, 2 half-open), ``routing_decision_seconds`` and
``upstream_seconds{worker}`` (time to upstream response headers) histograms; streamed
answers' ``time_to_first_token_seconds{worker}`` and ``inter_token_latency_seconds{worker}``
(:mod:`sessionroute.serve.metrics_stream`); the admission queue's waits, the decisions placed
after one, the wait cap and the policy's holds (:mod:`sessionroute.serve.metrics_admission`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sessionroute.router.core import RoutingCore
from sessionroute.router.health import WorkerHealth
from sessionroute.serve.histogram import Histogram as _Histogram
from sessionroute.serve.metrics_admission import AdmissionCollector, AdmissionMetrics
from sessionroute.serve.metrics_stream import StreamCollector, StreamMetrics

if TYPE_CHECKING:
    from sessionroute.serve.state import RedisState

__all__ = ["CONTENT_TYPE", "RouterMetrics", "SharedStateCollector"]

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
        evicted = CounterMetricFamily(
            "sessionroute_sessions_evicted",
            "Sessions dropped because the session table was full (entries or bytes)",
        )
        evicted.add_metric([], stats.evicted)
        table_bytes = GaugeMetricFamily(
            "sessionroute_session_table_bytes",
            "Estimated bytes of the session table (id length + a fixed overhead per entry; "
            "bounded by --session-table-max-bytes)",
        )
        table_bytes.add_metric([], core.policy.session_table_bytes())
        queue = core.admission
        waiting = GaugeMetricFamily(
            "sessionroute_admission_waiting", "Requests waiting in the admission queue"
        )
        waiting.add_metric([], len(queue))
        admission = CounterMetricFamily(
            "sessionroute_admission",
            "Requests the policy held back, by how they left the admission queue",
            labels=["outcome"],
        )
        placed = queue.admitted_after_wait - queue.placed_at_deadline - queue.placed_when_full
        admission.add_metric(["placed"], placed)  # each outcome counted once
        admission.add_metric(["refused_full"], queue.refused_full)
        admission.add_metric(["placed_when_full"], queue.placed_when_full)
        admission.add_metric(["refused_timeout"], queue.refused_timeout)
        admission.add_metric(["placed_at_deadline"], queue.placed_at_deadline)
        waited = CounterMetricFamily(
            "sessionroute_admission_wait_seconds",
            "Seconds waited in the admission queue by the requests placed from it (sum)",
        )
        waited.add_metric([], queue.wait_s_total)
        yield from (
            in_flight, sessions, available, circuit, decisions, released, expired, evicted,
            table_bytes, waiting, admission, waited,
        )  # fmt: skip


class RouterMetrics:
    """The metrics of one router instance.

    Per-request metrics (request and retry counters, the two latency histograms) are plain
    counts updated on the event loop (about 0.5 microseconds each, against 3-5 for a
    prometheus-client ``Counter``/``Histogram`` with its lock) and exported at scrape time by
    a custom collector, in the same families and format as prometheus-client's own types
    (without ``_created`` series).

    Args:
        core: the routing core whose state the gauges mirror.
        workers: returns the url -> :class:`WorkerHealth` map (for circuit states).
    """

    def __init__(
        self, core: RoutingCore, workers: Callable[[], Mapping[str, WorkerHealth]]
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests: dict[tuple[str, int], int] = {}
        """Finished proxied requests by (worker, final status)."""
        self.retries: dict[str, int] = {}
        """Upstream attempts retried, by the worker that failed."""
        self.client_closed: dict[str, int] = {}
        """Client connections the router closed, by reason (``connection_limit``,
        ``header_timeout``, ``body_timeout``, ``idle_timeout``)."""
        self.routing_seconds = _Histogram(_LATENCY_BUCKETS)
        self.upstream_seconds: dict[str, _Histogram] = {}
        self.stream = StreamMetrics()
        """Time to first token and inter-token gaps of streamed answers, per worker."""
        self.admission = AdmissionMetrics()
        """Waits in the admission queue and the decisions placed after one."""
        self.registry.register(_StateCollector(core, workers))
        self.registry.register(_RequestCollector(self))
        self.registry.register(StreamCollector(self.stream))
        self.registry.register(AdmissionCollector(self.admission, core))

    def count_request(self, worker: str, status: int) -> None:
        """Count one finished request (``status`` 499 when the client went away)."""
        key = (worker, status)
        requests = self.requests
        requests[key] = requests.get(key, 0) + 1

    def count_retry(self, worker: str) -> None:
        """Count one attempt on ``worker`` that is retried."""
        self.retries[worker] = self.retries.get(worker, 0) + 1

    def count_client_closed(self, reason: str) -> None:
        """Count one client connection closed by the router for ``reason``."""
        self.client_closed[reason] = self.client_closed.get(reason, 0) + 1

    def observe_routing(self, start: float, end: float) -> None:
        """Record the time one select-and-reserve took (``time.perf_counter`` readings)."""
        hist = self.routing_seconds
        seconds = end - start
        hist.counts[bisect_left(hist.bounds, seconds)] += 1  # inline: one call per request
        hist.total += seconds

    def observe_upstream(
        self, worker: str, start: float, end: float, status: int | None = None
    ) -> None:
        """Record the time to upstream response headers (``time.perf_counter`` readings),
        and with ``status`` also count the request as finished (:meth:`count_request`: an
        answer relayed whole as it came, the inline proxy's case, in one call, not two)."""
        hist = self.upstream_seconds.get(worker)
        if hist is None:
            hist = self.upstream_seconds[worker] = _Histogram(_LATENCY_BUCKETS)
        seconds = end - start
        hist.counts[bisect_left(hist.bounds, seconds)] += 1
        hist.total += seconds
        if status is not None:
            key = (worker, status)
            requests = self.requests
            requests[key] = requests.get(key, 0) + 1

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _RequestCollector(Collector):
    def __init__(self, metrics: RouterMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._m
        requests = CounterMetricFamily(
            "sessionroute_requests",
            "Proxied requests by worker and final status",
            labels=["worker", "status"],
        )
        for (worker, status), n in list(m.requests.items()):
            requests.add_metric([worker, str(status)], n)
        retries = CounterMetricFamily(
            "sessionroute_retries",
            "Upstream attempts retried, by the worker that failed",
            labels=["worker"],
        )
        for worker, n in list(m.retries.items()):
            retries.add_metric([worker], n)
        closed = CounterMetricFamily(
            "sessionroute_client_connections_closed",
            "Client connections closed by the router: over --max-connections, or too slow "
            "(head or body past --header-timeout-secs) or idle past --idle-timeout-secs",
            labels=["reason"],
        )
        for reason, n in list(m.client_closed.items()):
            closed.add_metric([reason], n)
        routing = HistogramMetricFamily(
            "sessionroute_routing_decision_seconds",
            "Time to select and reserve a worker, seconds",
            buckets=m.routing_seconds.buckets(),
            sum_value=m.routing_seconds.total,
        )
        upstream = HistogramMetricFamily(
            "sessionroute_upstream_seconds",
            "Time from sending upstream to receiving response headers, seconds",
            labels=["worker"],
        )
        for worker, hist in list(m.upstream_seconds.items()):
            upstream.add_metric([worker], hist.buckets(), hist.total)
        yield from (requests, retries, closed, routing, upstream)


class SharedStateCollector(Collector):
    """Prometheus collector of the shared state's health: ``sessionroute_state_up``,
    ``sessionroute_state_errors_total``, ``sessionroute_state_conflicts_total`` (placements
    decided again because another router changed the table), ``..._reconnects_total`` and
    ``..._round_trips_total``."""

    def __init__(self, state: RedisState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        s = self.state
        yield GaugeMetricFamily(
            "sessionroute_state_up", "1 while the shared state (Redis) is reachable", s.up
        )
        for name, doc, value in (
            ("errors", "Failed calls to the shared state", s.errors),
            ("conflicts", "Placements decided again after another router's change", s.conflicts),
            ("reconnects", "Reconnections to the shared state", s.reconnects),
            ("round_trips", "Round trips to the shared state on the request path", s.round_trips),
        ):
            yield CounterMetricFamily(f"sessionroute_state_{name}", doc, value)
