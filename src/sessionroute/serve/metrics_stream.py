"""Time to first token and inter-token latency of streamed answers, measured at the router.

For each streamed request (``"stream": true``) whose answer is relayed piece by piece, the
router times:

* ``sessionroute_time_to_first_token_seconds{worker}``: from the moment the request's body
  was complete at the router (before admission, placement and any retry) to the moment the
  first piece of the answer's body was written to the client: the wait at the router, the
  worker's queueing and prefill, and both network legs;
* ``sessionroute_inter_token_latency_seconds{worker}``: the gap between two consecutive
  pieces written to the client.

A *piece* is what one read from the worker brought. vLLM writes one server-sent event per
token (``stream_interval`` 1), and a worker that keeps up is read one event at a time, so a
piece is a token; events that arrive together (a worker or a network that batches) are one
piece and one gap, which is what the client sees too. The buckets are vLLM's own for
``vllm:time_to_first_token_seconds`` and ``vllm:inter_token_latency_seconds`` (with three
finer ones below 10 ms for the inter-token gaps), so the router's and the workers' views
compare bucket by bucket.

The cost is one ``time.perf_counter()`` and one bucket search per piece
(:meth:`StreamTimer.piece`), taken by the
:class:`~sessionroute.serve.exchange.Exchange` that relays it; nothing for answers relayed
whole and for requests that do not stream.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from sessionroute.serve.histogram import Histogram

__all__ = ["ITL_BUCKETS", "TTFT_BUCKETS", "StreamCollector", "StreamMetrics", "StreamTimer"]

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""Seconds: vLLM's ``vllm:time_to_first_token_seconds`` buckets."""

ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""Seconds: vLLM's ``vllm:inter_token_latency_seconds`` buckets, plus 1, 2.5 and 5 ms."""


class StreamTimer:
    """Times the pieces of one relayed answer (:meth:`piece` per piece written).

    Args:
        ttft: the worker's time-to-first-token histogram.
        itl: the worker's inter-token histogram.
        arrived: ``time.perf_counter()`` when the request was complete at the router.
    """

    __slots__ = ("_hist", "_itl", "_last")

    def __init__(self, ttft: Histogram, itl: Histogram, arrived: float) -> None:
        self._hist = ttft
        self._itl = itl
        self._last = arrived

    def piece(self) -> None:
        """A piece of the answer was written to the client now."""
        now = time.perf_counter()
        gap = now - self._last
        self._last = now
        hist = self._hist
        hist.counts[bisect_left(hist.bounds, gap)] += 1  # inline: once per piece
        hist.total += gap
        self._hist = self._itl  # every piece after the first is a gap


class StreamMetrics:
    """The per-worker histograms of streamed answers (module docstring)."""

    def __init__(self) -> None:
        self.ttft: dict[str, Histogram] = {}
        self.itl: dict[str, Histogram] = {}

    def timer(self, worker: str, arrived: float) -> StreamTimer:
        """A timer for one answer from ``worker`` to a request complete at ``arrived``
        (``time.perf_counter()``)."""
        ttft = self.ttft.get(worker)
        if ttft is None:
            ttft = self.ttft[worker] = Histogram(TTFT_BUCKETS)
            self.itl[worker] = Histogram(ITL_BUCKETS)
        return StreamTimer(ttft, self.itl[worker], arrived)


class StreamCollector(Collector):
    """Exports :class:`StreamMetrics` at scrape time."""

    def __init__(self, metrics: StreamMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        ttft = HistogramMetricFamily(
            "sessionroute_time_to_first_token_seconds",
            "Streamed answers: seconds from the request complete at the router to the first "
            "piece of the answer relayed to the client",
            labels=["worker"],
        )
        for worker, hist in list(self._m.ttft.items()):
            ttft.add_metric([worker], hist.buckets(), hist.total)
        itl = HistogramMetricFamily(
            "sessionroute_inter_token_latency_seconds",
            "Streamed answers: seconds between consecutive pieces relayed to the client",
            labels=["worker"],
        )
        for worker, hist in list(self._m.itl.items()):
            itl.add_metric([worker], hist.buckets(), hist.total)
        yield from (ttft, itl)
