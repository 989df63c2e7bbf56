"""Metrics of a live run, with the simulator's keys (``shared/WORKLOADS.md``).

Engine-side numbers come from the replicas' own ``/metrics`` (deltas over the arm:
``prefix_cache_hit_rate`` = hits / queries summed over replicas, preemptions, per-replica
tokens and requests), client-side numbers from the driver (latencies in the host's seconds:
emulated seconds when emulating, wall seconds otherwise), session lifecycle from our router's
``/metrics`` and placements from the taps. What a live run cannot measure is ``None``
(``ideal_busy_seconds``, ``queue_time_s``; session lifecycle behind another router;
TTFT/ITL without streaming). ``busy_fraction`` is *sampled*: the fraction of ``/metrics``
scrapes that saw a running request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from sessionroute.experiments.live.host import LiveHost
from sessionroute.experiments.live.scrape import MetricsSnapshot, scrape_all
from sessionroute.experiments.live.tap import Tap
from sessionroute.sim.metrics import cov, summary

__all__ = ["Sampler", "build_live_metrics"]


@dataclass(slots=True)
class Sampler:
    """Scrapes every replica every ``interval_s`` host seconds into time-series rows.

    Rows: ``t``, ``replica``, ``url``, ``running``, ``waiting``, ``kv_usage``, ``hit_rate``
    (over the interval; None without queries), ``preemptions`` (over the interval),
    ``busy_fraction`` (1.0 when a request was running at the scrape, else 0.0).
    """

    host: LiveHost
    urls: list[str]
    interval_s: float
    progress: Callable[[], float] | None = None
    report: Callable[[float], None] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    busy: list[list[float]] = field(default_factory=list)

    async def run(self, client: httpx.AsyncClient, first: list[MetricsSnapshot]) -> None:
        """Sample until cancelled."""
        prev = first
        self.busy = [[] for _ in self.urls]
        while True:
            await asyncio.sleep(self.interval_s / self.host.scale)
            snaps = await scrape_all(client, self.urls)
            t = self.host.now()
            for i, (url, now, before) in enumerate(zip(self.urls, snaps, prev, strict=True)):
                if not now.ok:
                    continue
                d = now.delta(before) if before.ok else {}
                q = d.get("prefix_cache_queries", 0.0)
                running = now.gauges.get("running")
                busy = 1.0 if running else 0.0
                self.busy[i].append(busy)
                self.rows.append(
                    {
                        "t": t,
                        "replica": i,
                        "url": url,
                        "running": running,
                        "waiting": now.gauges.get("waiting"),
                        "kv_usage": now.gauges.get("kv_usage"),
                        "hit_rate": d.get("prefix_cache_hits", 0.0) / q if q > 0 else None,
                        "preemptions": int(d.get("preemptions", 0.0)),
                        "busy_fraction": busy,
                    }
                )
            prev = [n if n.ok else p for n, p in zip(snaps, prev, strict=True)]
            if self.report is not None and self.progress is not None:
                self.report(min(1.0, self.progress()))


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def build_live_metrics(
    host: LiveHost,
    before: list[MetricsSnapshot],
    after: list[MetricsSnapshot],
    urls: list[str],
    *,
    sampler: Sampler | None,
    taps: list[Tap] | None,
    router: dict[str, Any],
    workload: dict[str, Any],
    wall_s: float,
    live: dict[str, Any],
) -> dict[str, Any]:
    """The metrics dict of one live arm (keys of the simulator's, see the module docstring)."""
    rec = host.rec
    c = rec.counts
    t = host.duration_s
    per: list[dict[str, Any]] = []
    hits = queries = preempt = 0.0
    busy: list[float] = []
    for i, url in enumerate(urls):
        d = after[i].delta(before[i]) if after[i].ok and before[i].ok else {}
        hits += d.get("prefix_cache_hits", 0.0)
        queries += d.get("prefix_cache_queries", 0.0)
        preempt += d.get("preemptions", 0.0)
        samples = sampler.busy[i] if sampler is not None and i < len(sampler.busy) else []
        b = sum(samples) / len(samples) if samples else None
        if b is not None:
            busy.append(b)
        rows = [r for r in (sampler.rows if sampler else []) if r["replica"] == i]
        tap = taps[i].record if taps else None
        per.append(
            {
                "replica": i,
                "url": url,
                "busy_fraction": b,
                "requests": int(d["requests"]) if "requests" in d else None,
                "prompt_tokens": int(d["prompt_tokens"]) if "prompt_tokens" in d else None,
                "output_tokens": (
                    int(d["generation_tokens"]) if "generation_tokens" in d else None
                ),
                "mean_running": _mean([r["running"] for r in rows]),
                "mean_waiting": _mean([r["waiting"] for r in rows]),
                "kv_usage": _mean([r["kv_usage"] for r in rows]),
                "hit_rate": _ratio(
                    d.get("prefix_cache_hits", 0.0), d.get("prefix_cache_queries", 0.0)
                ),
                "preemptions": int(d.get("preemptions", 0.0)),
                "sessions": len(tap.sessions) if tap is not None else None,
                "scrape_ok": after[i].ok and before[i].ok,
            }
        )
    mean_busy = sum(busy) / len(busy) if busy else 0.0
    decisions: dict[str, int] = router.get("decisions", {})
    active: dict[str, int] = router.get("active_sessions", {})
    has_router = bool(router)
    return {
        "sessions_completed": c["sessions_completed"],
        "sessions_cancelled": c["sessions_cancelled"],
        "sessions_per_s": _ratio(c["sessions_completed"], t),
        "output_tokens_per_s": _ratio(c["output_tokens"], t),
        "prompt_tokens_per_s": _ratio(c["prompt_tokens"], t),
        "prefix_cache_hit_rate": _ratio(hits, queries),
        "preemptions": int(preempt),
        "ttft_s": summary(rec.ttft_s) if rec.ttft_s else None,
        "itl_s": summary(rec.itl_s) if rec.itl_s else None,
        "turn_latency_s": summary(rec.turn_latency_s),
        "queue_time_s": None,
        "session_latency_s": summary(rec.session_latency_s),
        "steps": len(rec.steps),
        "step_time_s": summary([float(s["step_time_s"]) for s in rec.steps]),
        "group_latency_s": summary(rec.group_latency_s),
        "per_replica": per,
        "sessions_per_replica": [p["sessions"] for p in per] if taps else None,
        "load_imbalance_cov": cov(busy) if busy else None,
        "max_over_mean_busy": _ratio(max(busy, default=0.0), mean_busy) if busy else None,
        "sessions_new": decisions.get("new") if has_router else None,
        "sessions_repinned": decisions.get("repinned") if has_router else None,
        "sessions_expired": router.get("expired") if has_router else None,
        "sessions_released": router.get("released") if has_router else None,
        "sessions_leaked": sum(active.values()) if has_router else None,
        "sessions_held_at_end": sum(active.values()) if has_router else None,
        "session_moves": c["session_moves"] if taps else None,
        "requests_submitted": c["requests_submitted"],
        "requests_completed": c["requests_completed"],
        "requests_cancelled": c["requests_cancelled"],
        "requests_failed": c["requests_failed"],
        "prompt_tokens": c["prompt_tokens"],
        "output_tokens": c["output_tokens"],
        "cached_tokens": c["cached_tokens"],
        "wall_seconds": wall_s,
        "simulated_seconds": t if host.scale != 1.0 or live.get("replicas") == "emulate" else None,
        "run_seconds": t,
        "requests_per_wall_second": _ratio(c["requests_completed"], wall_s),
        "ideal_hit_rate": host.ideal.hit_rate,
        "ideal_busy_seconds": None,
        "block_size": host.block_size,
        "replicas": len(urls),
        "prefix_cache_resets": c["prefix_cache_resets"],
        "errors": list(rec.errors),
        "live": live,
        "workload": workload,
    }


def _mean(values: list[Any]) -> float | None:
    nums = [float(v) for v in values if isinstance(v, int | float)]
    return sum(nums) / len(nums) if nums else None
