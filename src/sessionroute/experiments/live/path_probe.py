"""Measuring the request path's delay for ``compare --fidelity`` (issue 35).

The calibration (``sessionroute calibrate``) times ``/v1/completions`` with token-id prompts
straight at the servers; the arms' requests take another path: the live client, the arm's
router, streamed ``/v1/chat/completions`` with the chat template. :func:`probe_path` sends
probe runs of its own along that path (a small ``toy`` workload at :data:`PROBE_LEVELS` of
load, through the experiment's first arm's router and policy, but :data:`SPREAD_LEVELS`
with ``round_robin`` where that router is sessionroute's or vllm-router; with the live runner
that runs the arms) and replays every probe
request at its send time into the simulator's engine on the profile just fitted
(:func:`sessionroute.experiments.replay.replay_results`). First it fits how the servers' steps
run on that path and slow down while the other servers are busy, from each request's live time
per output token over the replayed one
(:func:`sessionroute.calibrate.host.fit_host`); then, replayed with that, the difference,
client TTFT minus engine TTFT, against the other requests in flight
(:func:`sessionroute.calibrate.path.fit_path_delay`). Nothing of the compared runs enters it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from sessionroute.calibrate.host import HostSample, fit_host
from sessionroute.calibrate.path import PathFit, PathSample, fit_path_delay
from sessionroute.experiments.replay import busy_others, busy_spans, replay_results, replay_ttft
from sessionroute.experiments.results import RunOutput
from sessionroute.experiments.spec import ResolvedArm
from sessionroute.replica.api import ReplicaConfig

__all__ = [
    "HOST_LEVELS",
    "MIN_DECODE_TOKENS",
    "PROBE_LEVELS",
    "SPREAD_LEVELS",
    "fit_probe",
    "host_samples",
    "in_flight_at_send",
    "path_samples",
    "probe_arm",
    "probe_path",
]

MIN_DECODE_TOKENS = 8
"""Output tokens at least of a turn whose time per token :func:`host_samples` takes."""

PROBE_LEVELS: tuple[tuple[str, dict[str, Any]], ...] = (
    # sessions apart, most of the time one at a time: a server decodes with the others idle
    ("alone", {"sessions": 8, "arrival_rate_per_s": 0.6, "think_p50_s": 0.15,
               "think_p90_s": 0.3}),
    # one or two requests at a time per server, every server busy at once (SPREAD_LEVELS)
    ("light", {"sessions": 8, "arrival_rate_per_s": 3.0, "think_p50_s": 0.15, "think_p90_s": 0.3}),
    # sessions arriving together and back to back: up to ~7, then ~15 others in flight
    ("loaded", {"sessions": 8, "arrival_rate_per_s": 16.0, "think_p50_s": 0.02,
                "think_p90_s": 0.1}),
    ("heavy", {"sessions": 16, "arrival_rate_per_s": 32.0, "think_p50_s": 0.02,
               "think_p90_s": 0.1}),
)  # fmt: skip
"""Probe runs: name and the ``toy`` options that set their load (the rest in :func:`probe_arm`)."""

HOST_LEVELS: tuple[str, ...] = ("alone", "light")
"""The probe runs whose requests fit the host's sharing (:func:`host_samples`): a few requests
per server at a time, as the arms of the fidelity files run. In the loaded runs every server
is busy all the time (nothing to set beside an idle one) with full batches, whose steps the
others' work stretches by another amount (on the CPU tier, 2026-12-07: live over replayed time
per token about 1.1 there, 1.32-1.40 in the arms with a few requests per server)."""


SPREAD_LEVELS: tuple[str, ...] = ("light",)
"""The probe runs routed ``round_robin`` (one request to each server in turn) rather than by
the first arm's policy, where its router is sessionroute's or vllm-router: the host's sharing
needs requests that decode with the other servers busy, and a session-affine policy can put
most probe sessions on one server (consistent_hash did on a held-back KV-pressure file: in 3
of 5 runs only 7-10 requests decoded with the other server busy and the sharing went
unmeasured, and in one of them the simulator ran fast enough to miss the hit rate by 8
points; routed so, 36-38 of 48 did). A router of the user's (``command``) keeps the arm's
policy: its policy names are its own."""

_ROUTERS_WITH_ROUND_ROBIN = ("sessionroute", "sessionroute-inprocess", "vllm-router")


def probe_arm(template: ResolvedArm, name: str, load: Mapping[str, Any]) -> ResolvedArm:
    """``template`` (an arm of the compared experiment: its router, policy, replicas and
    ``[live]`` settings) with a probe workload of its own: ``toy`` sessions of 6 turns,
    200-400-token first prompts (at most a quarter of the context limit), 32-64-token
    replies, and ``load``'s sessions, arrivals and think times."""
    settings = dict(template.settings)
    limit = int(settings.get("replicas", {}).get("max_model_len") or 2048)
    first = max(32, min(200, limit // 8))
    options = {
        "turns_p50": 6, "turns_p90": 6, "turns_max": 6,
        "system_prompt_tokens": 32,
        "first_p50": first, "first_p90": 2 * first,
        "followup_p50": 32, "followup_p90": 64,
        "output_p50": 32, "output_p90": 64, "output_cap": 64,
        **load,
    }  # fmt: skip
    settings["workload"] = {"kind": "toy", "options": options}
    update: dict[str, Any] = {"name": f"path-probe-{name}", "settings": settings}
    router = settings.get("live", {}).get("router", "sessionroute")
    if name in SPREAD_LEVELS and router in _ROUTERS_WITH_ROUND_ROBIN:
        update |= {"policy": "round_robin", "policy_options": {}, "objective_options": {}}
    return template.model_copy(update=update)


def in_flight_at_send(turns: Sequence[Mapping[str, Any]]) -> list[int]:
    """For each turn, how many other turns of the run were in flight (sent and not yet
    answered, ``sent_s <= t < sent_s + latency_s``) when it was sent."""
    spans = [(float(t["sent_s"]), float(t["sent_s"]) + float(t["latency_s"])) for t in turns]
    return [
        sum(1 for j, (s, e) in enumerate(spans) if j != i and s <= sent < e)
        for i, (sent, _) in enumerate(spans)
    ]


def host_samples(
    turns: Sequence[Mapping[str, Any]], config: ReplicaConfig, replicas: int
) -> list[HostSample]:
    """Each probe turn's live time per output token over the same request's replayed at its
    send time into the simulator's engine with no sharing of the host, and the other servers
    busy over its decode (:mod:`sessionroute.calibrate.host`); turns of fewer than
    :data:`MIN_DECODE_TOKENS` output tokens, without a streamed token or of unknown replica are
    left out."""
    alone = _with_sharing(config, 1.0, 0.0)
    spans = busy_spans(turns)
    out = []
    for t, res in zip(turns, replay_results(turns, alone, replicas), strict=True):
        ttft = t.get("ttft_s")
        tokens = int(t["output_len"])
        if res is None or ttft is None or tokens < MIN_DECODE_TOKENS:
            continue
        first = float(t["sent_s"]) + float(ttft)
        last = float(t["sent_s"]) + float(t["latency_s"])
        replayed = res.finish_s - res.first_token_s
        if last > first and replayed > 0:
            rep = max(0, int(t["replica"]))
            out.append(HostSample(busy_others(spans, rep, first, last), (last - first) / replayed))
    return out


def path_samples(
    turns: Sequence[Mapping[str, Any]], config: ReplicaConfig, replicas: int
) -> list[PathSample]:
    """Path delays of one probe run's recorded turns: client TTFT minus the TTFT of the same
    request replayed at its send time into the simulator's engine (turns without a streamed
    token or of unknown replica are left out)."""
    replayed = replay_ttft(turns, config, replicas)
    flights = in_flight_at_send(turns)
    out = []
    for t, sim, n in zip(turns, replayed, flights, strict=True):
        live = t.get("ttft_s")
        if live is not None and sim is not None:
            out.append(PathSample(n, float(live) - sim))
    return out


def probe_path(
    runner: Callable[[ResolvedArm, int, Callable[[float], None]], RunOutput],
    template: ResolvedArm,
    config: ReplicaConfig,
    replicas: int,
    *,
    seed: int = 0,
    say: Callable[[str], None] = print,
    keep: dict[str, Sequence[Mapping[str, Any]]] | None = None,
) -> PathFit | None:
    """Run the probe (module docstring) and fit the path delay, with the host's sharing as its
    ``host`` (None when no request had enough output tokens); None when no probe request
    could be replayed (a router that does not name the worker of each request, with several
    servers: the replay needs it).

    Args:
        runner: runs an arm live once (a :class:`~sessionroute.experiments.live.runner.
            LiveArmRunner` with the servers up; its ``[live]`` must stream and record turns).
        template: the arm whose router, policy and settings the probe takes.
        config: the simulator's replica configuration on the fitted profile, without a path
            delay.
        replicas: how many servers.
        seed: the probe workload's seed.
        keep: where given, each probe run's recorded turns by its name (for a refit later).

    """
    recorded = {} if keep is None else keep
    runs: list[dict[str, Any]] = []
    for name, load in PROBE_LEVELS:
        out = runner(probe_arm(template, name, load), seed, lambda _f: None)
        recorded[name] = list(out.turns or [])
        got = path_samples(recorded[name], config, replicas)
        m = out.metrics
        server = (m.get("live") or {}).get("server_means") or {}
        row: dict[str, Any] = {
            "run": name,
            "requests": len(got),
            "client_ttft_mean_s": (m.get("ttft_s") or {}).get("mean"),
            "vllm_ttft_mean_s": server.get("ttft_mean_s"),
            "vllm_queue_mean_s": server.get("queue_mean_s"),
            "vllm_prefill_mean_s": server.get("prefill_mean_s"),
        }
        runs.append({k: v for k, v in row.items() if v is not None})  # TOML has no null
        say(f"  path probe {name}: {len(got)} requests")
    return fit_probe(recorded, config, replicas, extra={"runs": runs})


def fit_probe(
    recorded: Mapping[str, Sequence[Mapping[str, Any]]],
    config: ReplicaConfig,
    replicas: int,
    *,
    sharing: bool = True,
    extra: dict[str, Any] | None = None,
) -> PathFit | None:
    """Fit the probe runs' turns (by run name, as :func:`probe_path` records them): the host's
    sharing on the :data:`HOST_LEVELS` runs (``sharing`` False: none), then the path delay on
    every run replayed with it; None when no probe request could be replayed.

    Args:
        recorded: each probe run's answered turns, by its name in :data:`PROBE_LEVELS`.
        config: the simulator's replica configuration on the fitted profile, without a path
            delay; its sharing fields are not used.
        replicas: how many servers.
        sharing: fit the host's sharing (else the step terms as calibrated).
        extra: kept in the fit (:attr:`PathFit.extra`).
    """
    host = None
    if sharing:
        per_token = [
            s
            for name in HOST_LEVELS
            for s in host_samples(recorded.get(name, []), config, replicas)
        ]
        host = fit_host(per_token, replicas) if per_token else None
    if host is None:  # the profile the fit goes into gets 1 and 0 (``host_fields``)
        config = _with_sharing(config, 1.0, 0.0)
    else:
        config = _with_sharing(config, host.path_step_factor, host.peer_busy_slowdown)
    samples = [s for turns in recorded.values() for s in path_samples(turns, config, replicas)]
    if not samples:
        return None
    return replace(fit_path_delay(samples, extra), host=host)


def _with_sharing(config: ReplicaConfig, factor: float, slowdown: float) -> ReplicaConfig:
    """``config`` with its profile's ``path_step_factor`` and ``peer_busy_slowdown`` set."""
    profile = replace(config.profile, path_step_factor=factor, peer_busy_slowdown=slowdown)
    return replace(config, profile=profile)
