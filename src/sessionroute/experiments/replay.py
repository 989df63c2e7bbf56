"""The live requests replayed into the simulator's engine at their live send times.

``compare --fidelity`` compares a closed loop: each session's next turn leaves when its last
one came back, so a simulator that serves a turn faster sends the next one sooner, and under KV
pressure *when* a turn arrives decides what the LRU cache still holds. :func:`replay_run` takes
that out: every request a live run sent (its send time, the replica that served it, prompt and
output lengths, block keys) goes to a :class:`~sessionroute.replica.Replica` of that replica's
configuration at the same time, open loop. What the replay's cached tokens and preemptions
differ from the live ones by is the cache and scheduler model's error; what the closed loop
differs by beyond that is the timing's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sessionroute.replica import Replica
from sessionroute.replica.api import EngineRequest, ReplicaConfig, RequestResult

__all__ = [
    "busy_others",
    "busy_spans",
    "host_schedule",
    "replay_arms",
    "replay_results",
    "replay_run",
    "replay_ttft",
]

Span = tuple[float, float]


def busy_spans(turns: Sequence[Mapping[str, Any]]) -> dict[int, list[Span]]:
    """When each replica was busy in a live run: the union of its turns' ``[sent_s, sent_s +
    latency_s)``, as sorted disjoint spans per replica index (turns of unknown replica, -1,
    are left out)."""
    raw: dict[int, list[Span]] = defaultdict(list)
    for t in turns:
        if int(t["replica"]) >= 0:
            start = float(t["sent_s"])
            raw[int(t["replica"])].append((start, start + float(t["latency_s"])))
    out: dict[int, list[Span]] = {}
    for rep, spans in raw.items():
        merged: list[Span] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        out[rep] = merged
    return out


def busy_others(
    spans: Mapping[int, Sequence[Span]], replica: int, start: float, end: float
) -> float:
    """How many replicas other than ``replica`` were busy on average over ``[start, end)``
    (``spans`` from :func:`busy_spans`); at the instant ``start`` when ``end <= start``."""
    width = end - start
    total = 0.0
    for rep, rows in spans.items():
        if rep == replica:
            continue
        for s, e in rows:
            if width <= 0:
                total += float(s <= start < e)
            else:
                total += max(0.0, min(e, end) - max(s, start)) / width
    return total


def host_schedule(
    spans: Mapping[int, Sequence[Span]], replica: int, config: ReplicaConfig
) -> list[tuple[float, float]]:
    """``(t, factor)``: from ``t`` on, ``replica``'s step terms times ``factor``
    (``StepTimeProfile.host_factor`` of the other replicas busy then, in ``spans``); empty
    for a profile whose replicas share nothing."""
    profile = config.profile
    if profile.peer_busy_slowdown == 0:
        return []
    edges = sorted(
        (t, d) for rep, rows in spans.items() if rep != replica for s, e in rows
        for t, d in ((s, 1), (e, -1))
    )  # fmt: skip
    out: list[tuple[float, float]] = []
    busy = 0
    for t, d in edges:
        busy += d
        factor = profile.host_factor(busy)
        if out and out[-1][0] == t:
            out[-1] = (t, factor)
        elif not out or out[-1][1] != factor:
            out.append((t, factor))
    return out


def _replay_engine(
    rows: Sequence[Mapping[str, Any]],
    config: ReplicaConfig,
    schedule: Sequence[tuple[float, float]] = (),
) -> list[RequestResult]:
    """One replica's turns (in send order) through one engine: each one's result, in order.
    The engine's steps take the profile's ``host_factor(0)`` (no other replica busy) and
    from each ``(t, factor)`` of ``schedule`` on, ``factor`` (:func:`host_schedule`)."""
    base = config.slowdown
    engine = Replica(replace(config, slowdown=base * config.profile.host_factor(0)))
    results: list[RequestResult] = []
    changes = list(schedule)
    done = 0

    def change_until(now: float) -> None:
        nonlocal done
        while done < len(changes) and changes[done][0] <= now:
            t, factor = changes[done]
            results.extend(engine.advance(t))
            engine.set_slowdown(base * factor, t)
            done += 1

    for i, t in enumerate(rows):
        now = float(t["sent_s"])
        change_until(now)
        results.extend(engine.advance(now))
        req = EngineRequest(
            str(i), int(t["prompt_len"]), int(t["output_len"]), list(t["block_keys"]),
            t.get("cache_salt"),
        )  # fmt: skip
        engine.add_request(req, now)
    change_until(float("inf"))
    results.extend(engine.advance(float("inf")))
    by_id = {r.request_id: r for r in results}
    return [by_id[str(i)] for i in range(len(rows))]


def _by_replica(
    turns: Sequence[Mapping[str, Any]], replicas: int
) -> tuple[dict[int, list[int]], int]:
    """Indices of ``turns`` per replica, each in send order; and the turns of unknown replica
    (with one replica, a turn of unknown replica was served by it)."""
    by_replica: dict[int, list[int]] = defaultdict(list)
    skipped = 0
    for i, t in enumerate(turns):
        r = int(t["replica"])
        if r < 0 and replicas == 1:
            r = 0
        if r < 0:
            skipped += 1
        else:
            by_replica[r].append(i)
    for rows in by_replica.values():
        rows.sort(key=lambda i: float(turns[i]["sent_s"]))
    return by_replica, skipped


def replay_results(
    turns: Sequence[Mapping[str, Any]], config: ReplicaConfig, replicas: int = 1
) -> list[RequestResult | None]:
    """Each turn's result in the simulator's engine when it arrives at its live send time
    (open loop, one engine per replica, no path delay; times on the run's clock, ``sent_s``);
    None for a turn of unknown replica. Same order as ``turns`` (see :func:`replay_run`).
    Each replica's steps slow down while the others are busy in the live run, as the
    profile's ``peer_busy_slowdown`` says (:func:`host_schedule`)."""
    out: list[RequestResult | None] = [None] * len(turns)
    by_replica, _ = _by_replica(turns, replicas)
    # (``latency_s`` is read only for a profile whose replicas share a host)
    spans = busy_spans(turns) if config.profile.peer_busy_slowdown else {}
    for rep, rows in by_replica.items():
        results = _replay_engine(
            [turns[i] for i in rows], config, host_schedule(spans, rep, config)
        )
        for i, res in zip(rows, results, strict=True):
            out[i] = res
    return out


def replay_ttft(
    turns: Sequence[Mapping[str, Any]], config: ReplicaConfig, replicas: int = 1
) -> list[float | None]:
    """Each turn's time to first token in the replay (:func:`replay_results`:
    ``first_token_s - sent_s``), None for a turn of unknown replica."""
    return [
        None if r is None else r.first_token_s - float(t["sent_s"])
        for t, r in zip(turns, replay_results(turns, config, replicas), strict=True)
    ]


def replay_run(
    turns: Sequence[Mapping[str, Any]], config: ReplicaConfig, replicas: int = 1
) -> dict[str, Any]:
    """Replay one live run's turns (``RunOutput.turns``) open loop, one engine per replica.

    Args:
        turns: the run's answered turns, each with ``sent_s``, ``replica`` (-1: unknown),
            ``prompt_len``, ``output_len``, ``block_keys``, ``cache_salt`` and
            ``cached_tokens``.
        config: the simulator's replica configuration (profile, KV capacity, limits).
        replicas: how many replicas served the run (with one, a turn of unknown replica was
            served by it).

    Returns:
        ``{"requests", "skipped", "live_hit_rate", "replay_hit_rate", "same_cached",
        "replay_preemptions", "replay_queue_mean_s", "replay_prefill_mean_s"}`` over the turns
        whose replica is known (all of them with one replica): hit rates are cached over prompt
        tokens, ``same_cached`` the requests with exactly the live cached tokens; ``skipped``
        the turns of unknown replica; the means (seconds) are the engine's queue (arrival to
        first scheduled) and prefill (first scheduled to first token), to set beside vLLM's
        own. Hit rates and means are None without a replayed turn.
    """
    replayed = [
        (t, res)
        for t, res in zip(turns, replay_results(turns, config, replicas), strict=True)
        if res is not None
    ]
    skipped = len(turns) - len(replayed)
    prompt = live_cached = replay_cached = same = preemptions = requests = 0
    queue = prefill = 0.0
    for t, res in replayed:
        got = res.cached_tokens
        prompt += int(t["prompt_len"])
        live_cached += int(t["cached_tokens"])
        replay_cached += got
        same += int(got == int(t["cached_tokens"]))
        queue += res.queue_time_s
        prefill += res.first_token_s - res.first_scheduled_s
        preemptions += res.preemptions
        requests += 1
    return {
        "requests": requests,
        "skipped": skipped,
        "live_hit_rate": live_cached / prompt if prompt else None,
        "replay_hit_rate": replay_cached / prompt if prompt else None,
        "same_cached": same,
        "replay_preemptions": preemptions,
        "replay_queue_mean_s": queue / requests if requests else None,
        "replay_prefill_mean_s": prefill / requests if requests else None,
    }


def replay_arms(live: Sequence[Any], sim_arms: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """:func:`replay_run` for every live run that recorded its turns.

    Args:
        live: the live arms (``ArmResult``; their runs' ``turns``).
        sim_arms: the simulated side's resolved arms (``ResolvedArm``, same names): each gives
            the replica configuration its simulation used.

    Returns:
        arm name -> ``{"runs": [replay_run per live run], "live_hit_rate",
        "replay_hit_rate" (means over the runs), "error_pp" (replayed - live, points)}``; arms
        without recorded turns are left out.
    """
    from sessionroute.sim import SimSpec, replica_config

    settings = {a.name: a.settings for a in sim_arms}
    out: dict[str, dict[str, Any]] = {}
    for arm in live:
        recorded = [r.turns for r in arm.runs if r.turns]
        if not recorded or arm.name not in settings:
            continue
        count, config = replica_config(SimSpec.from_settings(settings[arm.name]))
        runs = [replay_run(turns, config, count) for turns in recorded]
        pairs = [(r["live_hit_rate"], r["replay_hit_rate"]) for r in runs]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        live_hit = sum(a for a, _ in pairs) / len(pairs) if pairs else None
        replay_hit = sum(b for _, b in pairs) / len(pairs) if pairs else None
        error = None if live_hit is None or replay_hit is None else 100 * (replay_hit - live_hit)
        out[arm.name] = {
            "runs": runs,
            "live_hit_rate": live_hit,
            "replay_hit_rate": replay_hit,
            "error_pp": error,
        }
    return out
