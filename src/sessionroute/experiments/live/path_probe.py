"""Measuring the request path's delay for ``compare --fidelity`` (issue 35).

The calibration (``sessionroute calibrate``) times ``/v1/completions`` with token-id prompts
straight at the servers; the arms' requests take another path: the live client, the arm's
router, streamed ``/v1/chat/completions`` with the chat template. :func:`probe_path` sends
probe runs of its own along that path (a small ``toy`` workload at :data:`PROBE_LEVELS` of
load, through the experiment's first arm's router and policy, with the live runner that runs
the arms), replays every probe request at its send time into the simulator's engine on the
profile just fitted (:func:`sessionroute.experiments.replay.replay_ttft`) and fits the
difference, client TTFT minus engine TTFT, against the other requests in flight
(:func:`sessionroute.calibrate.path.fit_path_delay`). Nothing of the compared runs enters it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sessionroute.calibrate.path import PathFit, PathSample, fit_path_delay
from sessionroute.experiments.replay import replay_ttft
from sessionroute.experiments.results import RunOutput
from sessionroute.experiments.spec import ResolvedArm
from sessionroute.replica.api import ReplicaConfig

__all__ = ["PROBE_LEVELS", "in_flight_at_send", "path_samples", "probe_arm", "probe_path"]

PROBE_LEVELS: tuple[tuple[str, dict[str, Any]], ...] = (
    # about one session at a time per server: the idle path
    ("light", {"sessions": 4, "arrival_rate_per_s": 3.0, "think_p50_s": 0.15, "think_p90_s": 0.3}),
    # sessions arriving together and back to back: up to ~7, then ~15 others in flight
    ("loaded", {"sessions": 8, "arrival_rate_per_s": 16.0, "think_p50_s": 0.02,
                "think_p90_s": 0.1}),
    ("heavy", {"sessions": 16, "arrival_rate_per_s": 32.0, "think_p50_s": 0.02,
               "think_p90_s": 0.1}),
)  # fmt: skip
"""Probe runs: name and the ``toy`` options that set their load (the rest in :func:`probe_arm`)."""


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
    return template.model_copy(update={"name": f"path-probe-{name}", "settings": settings})


def in_flight_at_send(turns: Sequence[Mapping[str, Any]]) -> list[int]:
    """For each turn, how many other turns of the run were in flight (sent and not yet
    answered, ``sent_s <= t < sent_s + latency_s``) when it was sent."""
    spans = [(float(t["sent_s"]), float(t["sent_s"]) + float(t["latency_s"])) for t in turns]
    return [
        sum(1 for j, (s, e) in enumerate(spans) if j != i and s <= sent < e)
        for i, (sent, _) in enumerate(spans)
    ]


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
) -> PathFit | None:
    """Run the probe (module docstring) and fit the path delay; None when no probe request
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

    """
    samples: list[PathSample] = []
    runs: list[dict[str, Any]] = []
    for name, load in PROBE_LEVELS:
        out = runner(probe_arm(template, name, load), seed, lambda _f: None)
        got = path_samples(out.turns or [], config, replicas)
        samples += got
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
    if not samples:
        return None
    return fit_path_delay(samples, {"runs": runs})
