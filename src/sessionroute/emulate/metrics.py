"""``/metrics`` of one emulated replica: vLLM's metric names in Prometheus text.

Each server has its own :class:`prometheus_client.CollectorRegistry` with one collector. Gauges
and counters are read from the engine at scrape time (the driver first advances the engine to
now); latency histograms are accumulated when a request finishes (own bucket counts, so the
inter-token histogram takes a request's ``output_tokens - 1`` gaps in one update). Names,
labels (``model_name``, ``engine``) and histogram buckets follow vLLM V1
(``vllm/v1/metrics/loggers.py``); latencies are in *simulated* seconds, i.e. what the modelled
GPU would show (wall seconds times ``time_scale``).

Differences from vLLM: ``vllm:inter_token_latency_seconds`` observes each request's mean gap
``output_tokens - 1`` times (the engine reports a mean and a max, not every gap);
``vllm:iteration_tokens_total`` has only its ``+Inf`` bucket (count: steps, sum: tokens).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sessionroute.replica import Replica, RequestResult

__all__ = ["EmulatorMetrics", "LatencyHistogram"]

_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
_REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class LatencyHistogram:
    """A Prometheus histogram kept as bucket counts (``le`` semantics: ``value <= bound``).

    Args:
        name: metric name, e.g. ``"vllm:time_to_first_token_seconds"``.
        doc: help text.
        buckets: finite upper bounds, increasing; ``+Inf`` is implicit.
    """

    __slots__ = ("buckets", "count", "counts", "doc", "name", "sum")

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.doc = doc
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        """Record ``value`` ``times`` times (``times >= 1``; 0 or less records nothing)."""
        if times < 1:
            return
        self.counts[bisect_left(self.buckets, value)] += times
        self.sum += value * times
        self.count += times

    def family(self, names: list[str], values: list[str]) -> HistogramMetricFamily:
        """The metric family with cumulative buckets."""
        cumulative: list[tuple[str, float]] = []
        acc = 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            acc += n
            cumulative.append(("+Inf" if bound == float("inf") else repr(bound), float(acc)))
        h = HistogramMetricFamily(self.name, self.doc, labels=names)
        h.add_metric(values, cumulative, self.sum)
        return h


class _EngineCollector(Collector):
    def __init__(
        self,
        replica: Replica,
        labels: dict[str, str],
        info: dict[str, str],
        histograms: list[LatencyHistogram],
    ) -> None:
        self._replica = replica
        self._labels = labels
        self._info = info
        self._histograms = histograms

    def collect(self) -> Iterator[Metric]:
        r = self._replica
        names = list(self._labels)
        values = list(self._labels.values())
        c = r.counters()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            m = CounterMetricFamily(name, doc, labels=names)
            m.add_metric(values, value)
            return m

        yield gauge("vllm:num_requests_running", "Requests in model batches.", r.num_running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting.", r.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = 100%).", r.kv_cache_usage)
        yield counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, tokens.", c.prefix_cache_queries
        )
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, tokens.", c.prefix_cache_hits)
        yield counter("vllm:num_preemptions", "Preemptions.", c.num_preemptions)
        yield counter("vllm:prompt_tokens", "Prefill tokens processed.", c.prompt_tokens)
        yield counter("vllm:generation_tokens", "Generation tokens.", c.generation_tokens)
        success = CounterMetricFamily(
            "vllm:request_success", "Finished requests.", labels=[*names, "finished_reason"]
        )
        success.add_metric([*values, "length"], c.requests_finished)
        yield success
        it = HistogramMetricFamily(
            "vllm:iteration_tokens_total", "Tokens per engine step.", labels=names
        )
        it.add_metric(values, [("+Inf", float(c.steps))], float(c.iteration_tokens))
        yield it
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "CacheConfig information.", labels=list(self._info)
        )
        info.add_metric(list(self._info.values()), 1.0)
        yield info
        for h in self._histograms:
            yield h.family(names, values)


class EmulatorMetrics:
    """The registry of one emulated replica.

    Args:
        replica: the engine (read at scrape time).
        model_name: the served model name (label ``model_name``).
        poll: called before each scrape to bring the engine to now (the driver's ``poll``).
    """

    def __init__(
        self, replica: Replica, model_name: str, poll: Callable[[], object] | None = None
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._poll = poll
        labels = {"model_name": model_name, "engine": "0"}
        cfg = replica.config
        info = {
            "block_size": str(cfg.block_size),
            "num_gpu_blocks": str(replica.num_gpu_blocks),
            "enable_prefix_caching": "True",
            "cache_dtype": "auto",
            "engine": "0",
        }
        self.ttft = LatencyHistogram(
            "vllm:time_to_first_token_seconds", "Time to first token, seconds.", _TTFT_BUCKETS
        )
        self.itl = LatencyHistogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency, seconds.", _ITL_BUCKETS
        )
        self.e2e = LatencyHistogram(
            "vllm:e2e_request_latency_seconds", "End-to-end latency, seconds.", _REQUEST_BUCKETS
        )
        self.queue = LatencyHistogram(
            "vllm:request_queue_time_seconds", "Time waiting, seconds.", _REQUEST_BUCKETS
        )
        hists = [self.ttft, self.itl, self.e2e, self.queue]
        self.registry.register(_EngineCollector(replica, labels, info, hists))

    def observe(self, res: RequestResult) -> None:
        """Record a finished request's latencies (simulated seconds)."""
        self.ttft.observe(res.ttft_s)
        self.e2e.observe(res.e2e_s)
        self.queue.observe(res.queue_time_s)
        self.itl.observe(res.itl_mean_s, res.output_tokens - 1)

    def render(self) -> bytes:
        """Prometheus text exposition of everything, after bringing the engine to now."""
        if self._poll is not None:
            self._poll()
        return generate_latest(self.registry)
