"""Metrics of a live run: the live side of the one results builder (``shared/WORKLOADS.md``).

:func:`build_live_metrics` fills an :class:`~sessionroute.record.ArmRecord` and hands it to
:func:`~sessionroute.record.arm_metrics`, the builder the simulator uses, so both kinds of arm
have the same keys computed the same way. Engine-side numbers come from the replicas' own
``/metrics`` (deltas over the arm: ``prefix_cache_hit_rate`` = hits / queries summed over
replicas, preemptions, per-replica tokens and requests), client-side numbers from the driver's
:class:`~sessionroute.record.Recorder` (latencies in the host's seconds: emulated seconds when
emulating, wall seconds otherwise), session lifecycle from our router's ``/metrics`` and
placements from the taps. What a live run cannot measure is ``None`` (``ideal_busy_seconds``,
``queue_time_s``, per-replica ``busy_seconds``; session lifecycle behind another router;
TTFT/ITL without streaming; ``session_moves`` without the taps). ``busy_fraction`` is
*sampled*: the fraction of ``/metrics`` scrapes that saw a running request. A live arm adds
``sessions_per_replica``, ``requests_failed``, ``run_seconds``, ``errors`` and ``live``.
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
from sessionroute.record import ArmRecord, ReplicaRecord, SessionLifecycle, arm_metrics

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


def _int(d: dict[str, float], key: str) -> int | None:
    return int(d[key]) if key in d else None


def _mean(values: list[Any]) -> float | None:
    nums = [float(v) for v in values if isinstance(v, int | float)]
    return sum(nums) / len(nums) if nums else None


def _replica(
    i: int,
    url: str,
    before: MetricsSnapshot,
    after: MetricsSnapshot,
    sampler: Sampler | None,
    tap: Tap | None,
) -> ReplicaRecord:
    ok = after.ok and before.ok
    d = after.delta(before) if ok else {}
    samples = sampler.busy[i] if sampler is not None and i < len(sampler.busy) else []
    rows = [r for r in (sampler.rows if sampler else []) if r["replica"] == i]
    return ReplicaRecord(
        index=i,
        url=url,
        prefix_cache_hits=d.get("prefix_cache_hits", 0.0),
        prefix_cache_queries=d.get("prefix_cache_queries", 0.0),
        preemptions=int(d.get("preemptions", 0.0)),
        busy_fraction=sum(samples) / len(samples) if samples else None,
        requests=_int(d, "requests"),
        prompt_tokens=_int(d, "prompt_tokens"),
        output_tokens=_int(d, "generation_tokens"),
        mean_running=_mean([r["running"] for r in rows]),
        mean_waiting=_mean([r["waiting"] for r in rows]),
        kv_usage=_mean([r["kv_usage"] for r in rows]),
        extra={"sessions": len(tap.record.sessions) if tap is not None else None, "scrape_ok": ok},
    )


def _sessions(
    router: dict[str, Any], finish_sessions: bool, keeps_sessions: bool, host: LiveHost, taps: bool
) -> SessionLifecycle | None:
    """The lifecycle from our router's counters (None for another router): every session it
    still holds at the end counts as leaked, since the workload has ended every session, if
    clients release sessions (``finish_sessions``; else leaked is None). For a policy without
    a session table, as in the simulator (``sim/report.py``): every session seen is new and
    every session move (seen by the taps; None without them) is a re-pin, behind any router."""
    if not keeps_sessions:
        c = host.rec.counts
        moves = c["session_moves"] if taps else None
        return SessionLifecycle(c["sessions_seen"], moves, 0, 0, 0, 0)
    if not router:
        return None
    decisions: dict[str, int] = router.get("decisions", {})
    held = sum(router.get("active_sessions", {}).values())
    return SessionLifecycle(
        new=decisions.get("new", 0),
        repinned=decisions.get("repinned", 0),
        expired=router.get("expired", 0),
        released=router.get("released", 0),
        leaked=held if finish_sessions else None,
        held_at_end=held,
    )


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
    finish_sessions: bool = True,
    keeps_sessions: bool = True,
) -> dict[str, Any]:
    """The metrics dict of one live arm (see the module docstring).

    Args:
        host: the host that drove the workload (its recorder, ideal cache and errors).
        before: each replica's ``/metrics`` before the workload.
        after: each replica's ``/metrics`` after it.
        urls: the replicas' URLs, in index order.
        sampler: the time-series sampler (busy fractions, gauges), if one ran.
        taps: the recording pass-throughs (placements), if any.
        router: :func:`~sessionroute.experiments.live.routers.router_session_metrics`.
        workload: the workload's own counters.
        wall_s: wall seconds the workload ran.
        live: the ``live`` description reported under ``"live"``.
        finish_sessions: whether the clients released their sessions (``[router]
            finish_sessions``); when not, ``sessions_leaked`` is None.
        keeps_sessions: whether the arm's policy keeps a session table (when not, the
            session counts come from the workload and the taps, as in the simulator).
    """
    rec = host.rec
    t = host.duration_s
    replicas = [
        _replica(i, url, before[i], after[i], sampler, taps[i] if taps else None)
        for i, url in enumerate(urls)
    ]
    unmeasured = {"queue_time_s", "ideal_busy_seconds"}
    if not host.stream:  # TTFT and ITL need the tokens as they arrive
        unmeasured |= {"ttft_s", "itl_s"}
    if not taps:
        unmeasured.add("session_moves")
    record = ArmRecord(
        recorder=rec,
        replicas=replicas,
        duration_s=t,
        simulated=host.scale != 1.0 or live.get("replicas") == "emulate",
        wall_s=wall_s,
        ideal_hit_rate=host.ideal.hit_rate,
        block_size=host.block_size,
        prefix_cache_resets=host.prefix_resets,
        sessions=_sessions(router, finish_sessions, keeps_sessions, host, bool(taps)),
        workload=workload,
        unmeasured=frozenset(unmeasured),
        extra={
            "sessions_per_replica": [r.extra["sessions"] for r in replicas] if taps else None,
            "requests_failed": rec.counts["requests_failed"],
            "router_decisions": router.get("decisions") if router else None,
            "admission": router.get("admission") if router else None,
            "run_seconds": t,
            "errors": list(host.errors),
            "live": live,
        },
    )
    return arm_metrics(record)
