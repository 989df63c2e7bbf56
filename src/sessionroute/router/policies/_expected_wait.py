"""SGLang model gateway's expected-wait score (``least_token_load``, ``cache_aware_v2``).

Source: SMG ``least_load`` (smg-project/smg PRs #1647, #2154, #2193); SMG's ``cache_aware``
resolves its final choice with the same scorer. Per worker, in seconds (lower is better)::

    wait(w) = (queued(w) + since_poll(w)) / tokens_per_s + kv_weight_s * k / (1 - k)

``queued(w)`` is the worker's waiting uncached prefill tokens at its last metrics poll,
``since_poll(w)`` the prompt tokens this router sent it since that poll (reset by every new
poll; without it each request between two polls would herd onto the same worker) and ``k``
its KV-cache usage, clamped to ``max_kv``. A worker without gauges while others have them is
scored ``in_flight(w) * mean_prefill_tokens / tokens_per_s``; when no worker has gauges the
score is the in-flight request count (join-shortest-queue), as in SMG.

Approximated here: the engines report waiting *requests* (vLLM's
``vllm:num_requests_waiting``), not SGLang's ``num_waiting_uncached_tokens``, so ``queued(w)``
is the waiting count times the mean uncached prompt tokens of the requests this router has in
flight there (or their mean prompt tokens when the caller tracks no uncached tokens), taken at
the poll; a poll is a change of the worker's scraped gauges (a scrape reading the same gauges
keeps the credit); ``tokens_per_s`` is one number for every worker (SMG reads each worker's
``gen_throughput`` and falls back to 2,000 tok/s, our default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sessionroute.errors import ConfigError
from sessionroute.router.policies._pick import LowestScore
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import EngineGauges

__all__ = ["ExpectedWait"]


class ExpectedWait:
    """The expected-wait scorer with its since-poll credit.

    Args:
        tokens_per_s: drain rate (tokens/s, > 0) turning token work into seconds.
        kv_weight_s: seconds of the KV barrier ``kv_weight_s * k / (1 - k)`` (>= 0).
        max_kv: KV usage is clamped to at most this, in (0, 1).
        mean_prefill_tokens: tokens one in-flight request is worth on a worker without gauges.

    Raises:
        ConfigError: on a value out of range (the message names it).
    """

    __slots__ = ("_mean", "_picker", "_polled", "_queued", "_since", "kv_weight_s", "max_kv", "tps")

    def __init__(
        self,
        tokens_per_s: float,
        kv_weight_s: float,
        max_kv: float,
        mean_prefill_tokens: int = 1024,
    ) -> None:
        if not tokens_per_s > 0:
            raise ConfigError(f"tokens_per_s must be > 0, got {tokens_per_s!r}")
        if not kv_weight_s >= 0:
            raise ConfigError(f"kv_penalty_s must be >= 0, got {kv_weight_s!r}")
        if not 0.0 < max_kv < 1.0:
            raise ConfigError(f"max_kv must be in (0, 1), got {max_kv!r}")
        if mean_prefill_tokens < 1:
            raise ConfigError(f"mean_prefill_tokens must be >= 1, got {mean_prefill_tokens!r}")
        self.tps = tokens_per_s
        self.kv_weight_s = kv_weight_s
        self.max_kv = max_kv
        self._mean = mean_prefill_tokens
        self._polled: dict[str, EngineGauges] = {}  # worker -> the gauges of its last poll
        self._queued: dict[str, float] = {}  # worker -> queued tokens at that poll
        self._since: dict[str, int] = {}  # worker -> prompt tokens sent since that poll
        self._picker = LowestScore()

    def scores(
        self,
        candidates: Sequence[str],
        cluster: ClusterView,
        uncached: Mapping[str, int] | None = None,
    ) -> list[float]:
        """Each candidate's score (seconds with gauges, else in-flight requests), folding in
        new polls first. ``uncached`` maps a worker to the uncached prompt tokens of the
        requests the caller has in flight there (None: use their prompt tokens)."""
        gauges = cluster.gauges
        gs = [gauges(w) for w in candidates]
        if all(g is None for g in gs):
            in_flight = cluster.in_flight
            return [float(in_flight(w)) for w in candidates]
        tps, weight, max_kv = self.tps, self.kv_weight_s, self.max_kv
        polled, queued, since = self._polled, self._queued, self._since
        out: list[float] = []
        for w, g in zip(candidates, gs, strict=True):
            if g is None:
                out.append(cluster.in_flight(w) * self._mean / tps)
                continue
            if polled.get(w) is not g:
                self._poll(w, g, cluster, uncached)
            k = g.kv_usage if g.kv_usage < max_kv else max_kv
            out.append((queued[w] + since[w]) / tps + weight * k / (1.0 - k))
        return out

    def queued(self, worker: str) -> float | None:
        """``worker``'s queued tokens at its last poll folded in by :meth:`scores`, or None
        before any."""
        return self._queued.get(worker)

    def _poll(
        self, worker: str, g: EngineGauges, cluster: ClusterView, uncached: Mapping[str, int] | None
    ) -> None:
        self._polled[worker] = g
        n = cluster.in_flight(worker)
        if not n or not g.waiting:
            self._queued[worker] = 0.0
        else:
            tokens = (
                cluster.in_flight_tokens(worker) if uncached is None else uncached.get(worker, 0)
            )
            self._queued[worker] = g.waiting * tokens / n
        self._since[worker] = 0

    def pick(
        self,
        candidates: Sequence[str],
        cluster: ClusterView,
        prompt_tokens: int,
        uncached: Mapping[str, int] | None = None,
    ) -> str:
        """The lowest-scoring candidate (ties: least recently picked), credited with
        ``prompt_tokens`` until its next poll."""
        worker = self._picker.pick(candidates, self.scores(candidates, cluster, uncached))
        if worker in self._since:
            self._since[worker] += prompt_tokens
        return worker

    def forget(self, worker: str) -> None:
        """Drop what is known of ``worker`` (it left the cluster)."""
        for d in (self._polled, self._queued, self._since):
            d.pop(worker, None)
        self._picker.forget(worker)
