"""The router's backpressure verdict: one JSON document an RL orchestrator can poll to size its
rollout concurrency (lower it while ``saturated``, instead of queueing turns at the router);
``sessionroute serve`` answers it at ``GET /backpressure``.

Shape (counts are requests unless named otherwise)::

    {"saturated": false,
     "reasons": [],
     "in_flight": 12, "queued": 0, "held_turns": 0, "sessions": 40,
     "workers_available": 3, "workers_total": 3,
     "rate_limit_tokens": null,
     "workers": [{"url": "http://10.0.0.1:8000", "available": true, "in_flight": 4,
                  "in_flight_tokens": 5120, "sessions": 14,
                  "engine": {"running": 4, "waiting": 0, "kv_cache_usage": 0.41}}, ...]}

* ``queued``: requests waiting in the router's admission queue (held by the policy, or waiting
  for a token of ``--max-concurrent-requests``); ``held_turns``: those of them that are later
  turns of a session the policy already pins;
* ``engine``: the worker's last scraped ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` (null until scraped, or with
  ``--scrape-interval-secs 0``);
* ``saturated`` is true, with each cause in ``reasons``, when: no worker is available
  (``no_available_worker``), requests wait at the router (``router_queue``), the rate limit has
  no token (``rate_limit``), or every available worker reports engine-queued requests or a KV
  cache at least :data:`KV_SATURATED` full (``workers_saturated``).
"""

from __future__ import annotations

from typing import Any

from sessionroute.router.core import RoutingCore

__all__ = ["KV_SATURATED", "snapshot"]

KV_SATURATED = 0.95
"""KV-cache usage from which a worker counts as saturated (vLLM preempts near a full cache)."""


def snapshot(core: RoutingCore) -> dict[str, Any]:
    """The backpressure document of ``core``'s router now (module docstring)."""
    cluster = core.cluster
    policy = core.policy
    counts = policy.session_counts()
    workers: list[dict[str, Any]] = []
    saturated_workers = 0
    for url in cluster.workers():
        gauges = cluster.gauges(url)
        available = cluster.is_healthy(url)
        engine = (
            None
            if gauges is None
            else {
                "running": gauges.running,
                "waiting": gauges.waiting,
                "kv_cache_usage": round(gauges.kv_usage, 4),
            }
        )
        if (
            available
            and gauges is not None
            and (gauges.waiting > 0 or gauges.kv_usage >= KV_SATURATED)
        ):
            saturated_workers += 1
        workers.append(
            {
                "url": url,
                "available": available,
                "in_flight": cluster.in_flight(url),
                "in_flight_tokens": cluster.in_flight_tokens(url),
                "sessions": counts.get(url, 0),
                "engine": engine,
            }
        )
    waiting = list(core.admission.waiting)
    held = sum(
        1
        for t in waiting
        if t.request.session_id is not None and policy.worker_of(t.request.session_id) is not None
    )
    available_n = len(cluster.healthy())
    limiter = core.limiter
    tokens = None if limiter is None else round(limiter.tokens, 3)
    reasons = []
    if not available_n:
        reasons.append("no_available_worker")
    if waiting:
        reasons.append("router_queue")
    if limiter is not None and limiter.wait_s(core.clock.now()) > 0:
        reasons.append("rate_limit")
    if available_n and saturated_workers == available_n:
        reasons.append("workers_saturated")
    return {
        "saturated": bool(reasons),
        "reasons": reasons,
        "in_flight": sum(w["in_flight"] for w in workers),
        "queued": len(waiting),
        "held_turns": held,
        "sessions": sum(counts.values()),
        "workers_available": available_n,
        "workers_total": len(workers),
        "rate_limit_tokens": tokens,
        "workers": workers,
    }
