"""The router of one live arm: ours (a ``sessionroute serve`` process or in-process) with the
arm's policy, PyPI's ``vllm-router`` binary, or any router from a command template.

The arm's ``policy_options`` are passed as router flags where a flag exists
(``session_ttl_s`` -> ``--session-ttl-secs``, ``cache_threshold``, ``balance_abs_threshold``,
``balance_rel_threshold``). Our router takes any other option of its policy as
``--policy-option KEY=JSON`` (an option the policy does not have is refused before anything
starts); a foreign router (vllm-router, a command template) refuses an option without a flag,
since it could not apply it. ``[router]`` settings map onto flags too (session headers, sweep
interval, retry backoff).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sessionroute.errors import ConfigError
from sessionroute.experiments.live.procs import ProcessSet, expand_command, free_port, wait_healthy
from sessionroute.experiments.live_section import LiveSection
from sessionroute.router.config import RouterConfig
from sessionroute.router.policies.registry import choose_policy
from sessionroute.serve.config import router_flags as serve_router_flags
from sessionroute.sim import RouterSection

__all__ = ["RouterInfo", "router_flags", "router_session_metrics", "start_arm_router"]

_OPTION_FLAGS = {
    "session_ttl_s": "--session-ttl-secs",
    "cache_threshold": "--cache-threshold",
    "balance_abs_threshold": "--balance-abs-threshold",
    "balance_rel_threshold": "--balance-rel-threshold",
}

VLLM_ROUTER_COMMAND = (
    "${VLLM_ROUTER} --host ${HOST} --port ${PORT} --policy ${POLICY} --worker-urls ${WORKER_URLS}"
    " --log-level warning --prometheus-port ${METRICS_PORT}"
)
"""How the ``vllm-router`` router kind is started (session TTL through its environment; its
Prometheus exporter on a free port, since its default 29000 may be taken)."""


@dataclass(slots=True)
class RouterInfo:
    """A started router: its URL and whether it is ours (its ``/metrics`` are understood)."""

    url: str
    kind: str
    ours: bool


def router_flags(
    policy: str, options: dict[str, Any], router: RouterSection, *, ours: bool
) -> list[str]:
    """The router flags for an arm's policy, its options and the ``[router]`` settings.

    Options without a flag of their own go to ``sessionroute serve`` as ``--policy-option
    KEY=JSON``.

    Raises:
        ConfigError: for an option no flag of a foreign router carries.
    """
    ttl = options.get("session_ttl_s", router.session_ttl_s)
    if ours:
        choose_policy(policy, options)  # refuse an unknown policy or option before starting
    flags = ["--policy", policy]
    for key, value in options.items():
        flag = _OPTION_FLAGS.get(key)
        if flag is None and ours:
            flags += ["--policy-option", f"{key}={json.dumps(value)}"]
            continue
        if flag is None:
            raise ConfigError(
                f"policy option {key!r} of {policy!r} cannot be passed to a live router "
                f"(flags exist for {', '.join(sorted(_OPTION_FLAGS))})"
            )
        if key != "session_ttl_s":
            flags += [flag, str(value)]
    if ours:
        core = {name: getattr(router, name) for name in RouterConfig.model_fields}
        flags += serve_router_flags(RouterConfig(**{**core, "session_ttl_s": float(ttl)}))
    return flags


def _vllm_router_binary() -> str:
    local = Path(sys.executable).parent / "vllm-router"
    if local.exists():
        return str(local)
    found = shutil.which("vllm-router")
    if found is None:
        raise ConfigError("vllm-router is not installed (pip install vllm-router==0.1.17)")
    return found


@contextlib.asynccontextmanager
async def start_arm_router(
    kind: str,
    live: LiveSection,
    policy: str,
    options: dict[str, Any],
    router: RouterSection,
    worker_urls: list[str],
    procs: ProcessSet,
    log_dir: Path,
    *,
    extra_flags: list[str] | None = None,
) -> AsyncIterator[RouterInfo]:
    """Start the arm's router, wait until it answers, yield it, stop it.

    Args:
        kind: ``live.router`` of the arm.
        live: the arm's ``[live]`` section.
        policy: registry name (or ``module:Class`` for ours).
        options: the arm's policy options.
        router: the arm's ``[router]`` section.
        worker_urls: what the router routes to.
        procs: registers router processes.
        log_dir: where router logs go.
        extra_flags: more ``sessionroute serve`` flags (the KV event streams of a
            ``kv_aware`` arm); only our router takes them.

    Raises:
        ConfigError: unknown options, missing binary or template. LiveStartError: it did not
            come up within ``live.start_timeout_s``.
    """
    ttl = options.get("session_ttl_s", router.session_ttl_s)
    extra = list(extra_flags or ())
    if extra and kind not in ("sessionroute", "sessionroute-inprocess"):
        raise ConfigError(f"live.router {kind!r} cannot take KV event streams (use sessionroute)")
    if kind == "sessionroute-inprocess":
        import argparse

        from sessionroute.serve import RouterSettings, settings_from_args
        from sessionroute.serve.flags import add_arguments
        from sessionroute.serve.runner import start_router

        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(
            [
                "--host", live.host, "--port", "0", "--log-level", "warning",
                "--request-timeout-secs", repr(live.request_timeout_s),
                "--worker-urls", *worker_urls,
                *router_flags(policy, options, router, ours=True), *extra,
            ]
        )  # fmt: skip
        settings: RouterSettings = settings_from_args(args)
        running = await start_router(settings)
        try:
            yield RouterInfo(running.url, kind, True)
        finally:
            await running.stop()
        return
    port = free_port(live.host)
    env = dict(os.environ)
    if kind == "sessionroute":
        argv = [
            sys.executable, "-m", "sessionroute.cli", "serve",
            "--host", live.host, "--port", str(port), "--log-level", "warning",
            "--request-timeout-secs", repr(live.request_timeout_s),
            "--worker-urls", *worker_urls,
            *router_flags(policy, options, router, ours=True), *extra,
        ]  # fmt: skip
        health = live.router_health_path or "/readiness"
    else:
        router_flags(policy, options, router, ours=False)  # refuse unknown options
        if kind == "vllm-router":
            if ":" in policy:
                raise ConfigError(f"vllm-router cannot run a user policy ({policy!r})")
            template = VLLM_ROUTER_COMMAND
            env["VLLM_ROUTER"] = _vllm_router_binary()
        elif live.router_command is None:
            raise ConfigError('live.router = "command" needs live.router_command')
        else:
            template = live.router_command
        env.setdefault("RUST_LOG", "warn")
        env["VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S"] = str(int(ttl))
        variables = {
            "PORT": str(port),
            "HOST": live.host,
            "POLICY": policy,
            "WORKER_URLS": " ".join(worker_urls),
            "SESSION_TTL_S": str(int(ttl)),
            "METRICS_PORT": str(free_port(live.host)),
        }
        argv = expand_command(template, variables, env, "live.router_command")
        health = live.router_health_path or "/liveness"
    url = f"http://{live.host}:{port}"
    proc = procs.start(f"router ({kind})", argv, env, log_dir / f"router-{kind}-{port}.log")
    try:
        await asyncio.to_thread(
            wait_healthy, url + health, proc, live.start_timeout_s, f"router ({kind})"
        )
        yield RouterInfo(url, kind, kind == "sessionroute")
    finally:
        await asyncio.to_thread(procs.stop, proc)


async def router_session_metrics(client: httpx.AsyncClient, info: RouterInfo) -> dict[str, Any]:
    """Session counters from our router's ``/metrics`` (empty for other routers).

    Returns:
        ``decisions`` (kind -> count), ``released``, ``expired``, ``active_sessions``
        (worker URL -> sessions still pinned), ``admission`` (the simulator's admission
        counters: ``placed_after_wait``, ``placed_at_deadline``, ``refused_full``,
        ``placed_when_full``, ``refused_timeout``, ``wait_s_total``).
    """
    if not info.ours:
        return {}
    try:
        r = await client.get(info.url + "/metrics")
        r.raise_for_status()
    except httpx.HTTPError:
        return {}
    out: dict[str, Any] = {"decisions": {}, "active_sessions": {}, "released": 0, "expired": 0}
    outcomes: dict[str, float] = {}
    wait_s = 0.0
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            if s.name == "sessionroute_decisions_total":
                out["decisions"][s.labels.get("kind", "")] = int(s.value)
            elif s.name == "sessionroute_sessions_released_total":
                out["released"] = int(s.value)
            elif s.name == "sessionroute_sessions_expired_total":
                out["expired"] = int(s.value)
            elif s.name == "sessionroute_active_sessions":
                out["active_sessions"][s.labels.get("worker", "")] = int(s.value)
            elif s.name == "sessionroute_admission_total":
                outcomes[s.labels.get("outcome", "")] = s.value
            elif s.name == "sessionroute_admission_wait_seconds_total":
                wait_s = s.value
    deadline = int(outcomes.get("placed_at_deadline", 0))
    when_full = int(outcomes.get("placed_when_full", 0))
    out["admission"] = {  # the simulator's counts: placed_after_wait holds the other two
        "placed_after_wait": int(outcomes.get("placed", 0)) + deadline + when_full,
        "placed_at_deadline": deadline,
        "refused_full": int(outcomes.get("refused_full", 0)),
        "placed_when_full": when_full,
        "refused_timeout": int(outcomes.get("refused_timeout", 0)),
        "wait_s_total": round(wait_s, 3),
    }
    return out
