"""Waits at the router: the admission queue's wait histogram, the decisions placed after a
wait, the policy's holds, the wait cap, and the wait in the response.

A request the policy holds back (``Policy.admit``: e.g. ``adaptive_sticky`` past the knee,
``adaptive_hold``'s held sessions) or the rate limit has no token for waits in the router
core's admission queue (:mod:`sessionroute.router.admission`) until it is placed, refused at
its deadline, or its client goes away. Exported (prefix ``sessionroute_``):

* ``admission_queue_wait_seconds{outcome}`` (histogram): how long each request waited, by how
  it left: ``placed`` (sent to a worker, at the latest at its deadline for policies that place
  then), ``refused`` (408/503 at its deadline, or no worker), ``abandoned`` (the client went
  away);
* ``decisions_after_wait_total{kind}``: the requests placed from the queue, by the router
  core's decision kind (the same kinds as ``decisions_total``, which counts them too);
* ``admission_wait_cap_seconds`` (gauge): the longest a request may wait
  (:meth:`~sessionroute.router.RoutingCore.admission_max_wait_s`: the policy's own bound, else
  ``--admission-max-wait-secs``, 60 s by default, or ``--queue-timeout-secs`` with the rate
  limit);
* for a policy that reports holds in its counters (``adaptive_hold``: ``holds``,
  ``held_turns``, ``held_now``): ``session_holds_total``, ``held_turns_total`` and
  ``held_sessions`` (gauge), read from the policy at scrape time.

The queue's depth is ``admission_waiting`` and its outcomes ``admission_total{outcome}``
(:mod:`sessionroute.serve.metrics`). A response to a request that waited carries
:data:`WAIT_HEADER` with the wait in milliseconds (absent: it did not wait).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sessionroute.router.admission import Ticket
from sessionroute.router.core import RoutingCore
from sessionroute.serve.histogram import Histogram
from sessionroute.types import DecisionKind

__all__ = ["WAIT_BUCKETS", "WAIT_HEADER", "AdmissionCollector", "AdmissionMetrics", "wait_line"]

WAIT_HEADER = b"x-sessionroute-wait-ms"
"""The response header with the milliseconds a request waited in the admission queue."""

WAIT_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
)  # fmt: skip
"""Seconds: the admission wait histogram's buckets (up to the longest caps in use)."""

_OUTCOMES = ("placed", "refused", "abandoned")

_HOLD_COUNTERS = (
    ("holds", "session_holds_total", "Sessions the policy held (their next turns wait)"),
    ("held_turns", "held_turns_total", "Turns that waited because their session was held"),
)


def wait_line(waited_s: float) -> bytes:
    """The :data:`WAIT_HEADER` line for a wait of ``waited_s`` seconds."""
    return WAIT_HEADER + b": %.3f\r\n" % (waited_s * 1000.0)


class AdmissionMetrics:
    """Counts of the requests that waited in the admission queue (module docstring)."""

    def __init__(self) -> None:
        self.waits = {outcome: Histogram(WAIT_BUCKETS) for outcome in _OUTCOMES}
        self.after_wait: dict[DecisionKind, int] = dict.fromkeys(DecisionKind, 0)

    def observe(self, ticket: Ticket, now: float) -> None:
        """A request's ticket is done waiting (placed, refused, or its client went away);
        ``now``: the router core's clock."""
        res = ticket.reservation
        if res is not None:
            self.waits["placed"].observe(res.waited_s)
            self.after_wait[res.kind] += 1
            return
        outcome = "refused" if ticket.error is not None else "abandoned"
        self.waits[outcome].observe(max(now - ticket.since, 0.0))


class AdmissionCollector(Collector):
    """Exports :class:`AdmissionMetrics`, the wait cap and the policy's holds."""

    def __init__(self, metrics: AdmissionMetrics, core: RoutingCore) -> None:
        self._m = metrics
        self._core = core

    def collect(self) -> Iterator[Metric]:
        m = self._m
        core = self._core
        waits = HistogramMetricFamily(
            "sessionroute_admission_queue_wait_seconds",
            "Seconds requests waited in the router's admission queue, by how they left it",
            labels=["outcome"],
        )
        for outcome, hist in m.waits.items():
            waits.add_metric([outcome], hist.buckets(), hist.total)
        after = CounterMetricFamily(
            "sessionroute_decisions_after_wait",
            "Requests placed from the admission queue, by decision kind",
            labels=["kind"],
        )
        for kind, n in m.after_wait.items():
            after.add_metric([kind.value], n)
        cap = GaugeMetricFamily(
            "sessionroute_admission_wait_cap_seconds",
            "Longest wait in the admission queue before a request is placed or refused",
        )
        cap.add_metric([], core.admission_max_wait_s())
        yield from (waits, after, cap)
        counters = core.policy.counters()
        for key, name, text in _HOLD_COUNTERS:
            value = counters.get(key)
            if isinstance(value, int | float):
                family = CounterMetricFamily("sessionroute_" + name.removesuffix("_total"), text)
                family.add_metric([], value)
                yield family
        held = counters.get("held_now")
        if isinstance(held, int | float):
            gauge = GaugeMetricFamily(
                "sessionroute_held_sessions", "Sessions held by the policy now"
            )
            gauge.add_metric([], held)
            yield gauge
