"""The ``sessionroute serve`` command line (argparse only; cheap to import).

The flags shared with vllm-router keep its names and defaults (vllm-router 0.1.17,
``shared/ROUTER.md``); ours are ``--session-headers``, ``--session-ttl-secs``,
``--session-sweep-interval-secs``, ``--router-api-key``, ``--shutdown-timeout-secs`` and
``--policy module:Class``. vllm-router options this router does not implement (PD
disaggregation, service discovery, rate limiting, ...) fail with a message naming them rather
than being silently ignored (:mod:`sessionroute.serve.unsupported_flags`). The defaults are
:mod:`sessionroute.serve.flag_defaults`' (re-exported here); validation lives in
:mod:`sessionroute.serve.config`.
"""

from __future__ import annotations

import argparse

from sessionroute.router.config import DEFAULT_SESSION_HEADERS
from sessionroute.router.policies.registry import policy_names
from sessionroute.router.session_keys import DEFAULT_SESSION_BODY_FIELDS
from sessionroute.serve.flag_defaults import (
    DEFAULT_REQUEST_ID_HEADERS,
    DEFAULTS,
    ROUTER_FLAGS,
    SESSION_TTL_ENV,
)
from sessionroute.serve.flag_groups import (
    add_hardening_arguments,
    add_kv_arguments,
    add_rate_limit_arguments,
)
from sessionroute.serve.unsupported_flags import add_unsupported

__all__ = [
    "DEFAULTS",
    "DEFAULT_REQUEST_ID_HEADERS",
    "ROUTER_FLAGS",
    "SESSION_TTL_ENV",
    "add_arguments",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every ``serve`` flag to ``parser`` (defaults shown by ``--help``).

    The usage line is short: argparse's generated one lists all ~35 flags, and printed it
    above every error (a mistyped flag scrolled its one-line message off a 30-line block).
    """
    parser.usage = "%(prog)s [--worker-urls URL ...] [--policy POLICY] [options] (see --help)"
    d = DEFAULTS
    a = parser.add_argument
    a("--host", default=d["host"], help="address to bind (default: %(default)s)")
    a("--port", type=int, default=d["port"], help="port to bind (default: %(default)s)")
    a("--worker-urls", nargs="*", default=[], metavar="URL", help="worker base URLs")
    a(
        "--policy",
        default=d["policy"],
        help=f"routing policy: {', '.join(policy_names())}, package.module:Class or "
        "path/to/file.py:Class; options "
        "may follow in parentheses, e.g. 'consistent_hash_bounded_load(c=1.05)' "
        "(sessionroute only; default: %(default)s)",
    )
    a(
        "--policy-config",
        metavar="FILE",
        default=None,
        help="a policy file (TOML: policy = NAME and an [options] table, as `sessionroute tune` "
        "writes it); its options give way to --policy's inline ones and to --policy-option "
        "(sessionroute only)",
    )
    a(
        "--policy-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a policy option by its name in docs/policies.md (repeatable; VALUE is read as "
        "JSON when it parses, e.g. 0.9, 12, null, true, else as a string; sessionroute only), "
        "e.g. --policy cache_aware_v2 --policy-option kv_overload_threshold=0.9",
    )
    a(
        "--objective",
        choices=("rl", "serving"),
        default=None,
        help="what the traffic served is judged on (docs/objectives.md): the policy then runs "
        "with its options for that objective, under the ones written with --policy, "
        "--policy-config and --policy-option; e.g. adaptive_hold with 'serving' runs with "
        "wait_bound=true (a held turn waits no longer than its engine's queue would make it), "
        "max_wait_s=900, short_turns=3 and short_place=cache_aware_v2 (short sessions "
        "placed by shared prefix and prefill wait; the router then reads prompt content), "
        "ceiling_floor=0.5, knee_pressure=0.8, count_weight=0 and pack_past_knee=true "
        "(new sessions packed once every worker is past its knee) and overload_window_s=120 "
        "(rule 8: one worker given up once the fleet's queues stop draining) "
        "(sessionroute only; default: the "
        "policy's own defaults, which for adaptive_hold are RL's)",
    )
    a(
        "--session-headers",
        nargs="+",
        default=list(DEFAULT_SESSION_HEADERS),
        metavar="H",
        help="headers carrying the session id, checked in order (default: "
        + " ".join(DEFAULT_SESSION_HEADERS)
        + ")",
    )
    a(
        "--session-body-fields",
        nargs="*",
        default=list(DEFAULT_SESSION_BODY_FIELDS),
        metavar="FIELD",
        help="JSON body fields (dotted paths) read for the session id, in order, when no "
        "session header is present; none: headers only (default: "
        + " ".join(DEFAULT_SESSION_BODY_FIELDS)
        + ")",
    )
    a(
        "--request-id-headers",
        nargs="*",
        default=None,
        metavar="H",
        help="headers echoed back as x-request-id (default: "
        + " ".join(DEFAULT_REQUEST_ID_HEADERS)
        + ")",
    )
    a(
        "--session-ttl-secs",
        type=float,
        default=None,
        help="idle seconds before a session expires "
        f"(default: ${SESSION_TTL_ENV} or {d['session_ttl_secs']:g})",
    )
    a(
        "--session-sweep-interval-secs",
        type=float,
        default=d["session_sweep_interval_secs"],
        help="seconds between background sweeps (idle sessions expire; a removed worker's "
        "index entries are dropped, for the content-indexing policies) (default: %(default)s)",
    )
    for name, typ, help_text in (
        ("request_timeout_secs", float, "upstream request timeout, seconds"),
        ("health_check_interval_secs", float, "seconds between health checks"),
        (
            "health_recheck_interval_secs",
            float,
            "seconds between extra checks of unhealthy workers only, so a worker that comes "
            "up is back within about threshold x this (sessionroute only)",
        ),
        ("health_check_timeout_secs", float, "health check timeout, seconds"),
        ("health_failure_threshold", int, "consecutive failed checks before unhealthy"),
        ("health_success_threshold", int, "consecutive passed checks before healthy"),
        ("health_check_endpoint", str, "health check path"),
        (
            "worker_startup_timeout_secs",
            float,
            "seconds to wait at startup for the workers to pass a health check; with none "
            "passed by then the router exits with status 1 (docs/router.md, Deploying)",
        ),
        (
            "worker_startup_check_interval",
            float,
            "seconds between health checks of the workers not yet up at startup",
        ),
        ("retry_max_retries", int, "total upstream attempts per request"),
        ("retry_initial_backoff_ms", float, "first retry backoff, milliseconds"),
        ("retry_max_backoff_ms", float, "largest retry backoff, milliseconds"),
        ("retry_backoff_multiplier", float, "backoff growth per retry"),
        ("retry_jitter_factor", float, "relative jitter of each backoff, 0..1"),
        ("cb_failure_threshold", int, "consecutive failures that open a worker's circuit"),
        ("cb_success_threshold", int, "successes in half-open state that close it"),
        ("cb_timeout_duration_secs", float, "seconds a circuit stays open"),
        ("max_payload_size", int, "largest request body, bytes"),
        ("prometheus_host", str, "address of the separate metrics listener"),
        ("cache_threshold", float, "cache_aware: prefix-match threshold 0..1"),
        (
            "balance_abs_threshold",
            int,
            "cache_aware: absolute imbalance; cache_aware_v2: spill gate",
        ),
        (
            "balance_rel_threshold",
            float,
            "cache_aware: relative imbalance; cache_aware_v2: spill gate",
        ),
        ("shutdown_timeout_secs", float, "seconds in-flight requests get on shutdown"),
        (
            "content_block_tokens",
            int,
            "tokens per content block of the prefix keys content-aware policies read "
            "(sessionroute only)",
        ),
        (
            "admission_max_waiting",
            int,
            "requests that may wait for admission when the policy holds them back "
            "(sessionroute only)",
        ),
        (
            "admission_max_wait_secs",
            float,
            "longest wait for admission before a 503 (sessionroute only)",
        ),
    ):
        a(
            "--" + name.replace("_", "-"),
            type=typ,
            default=d[name],
            help=f"{help_text} (default: %(default)s)",
        )
    a(
        "--scrape-interval-secs",
        type=float,
        default=d["scrape_interval_secs"],
        help="seconds between scrapes of each worker's /metrics for the engine gauges "
        "policies read (vllm:num_requests_running/waiting, kv_cache_usage_perc); 0 disables "
        "(sessionroute only; default: %(default)s)",
    )
    a(
        "--state-url",
        default=d["state_url"],
        metavar="redis://HOST:PORT/DB",
        help="share the session table (pins, per-worker session counts) and in-flight counts "
        "with every router pointed at the same Redis: run several routers behind an L4 "
        "balancer, restart one without losing a pin. Redis unreachable: routing continues on "
        "local state and reconnects (sessionroute only; default: in-process state)",
    )
    a(
        "--state-key-prefix",
        default=d["state_key_prefix"],
        help="prefix of the shared state's Redis keys: routers share state when they share "
        "URL and prefix (default: %(default)s)",
    )
    a(
        "--state-lease-secs",
        type=float,
        default=d["state_lease_secs"],
        help="seconds a router's in-flight counts outlive it in the shared state when it dies "
        "(renewed every third of it; default: %(default)s)",
    )
    a(
        "--state-timeout-secs",
        type=float,
        default=d["state_timeout_secs"],
        help="timeout of each call to the shared state; a call that takes longer counts as "
        "Redis unreachable (default: %(default)s)",
    )
    a(
        "--max-tree-size",
        type=int,
        default=None,
        help="cache_aware: per-worker bound of the prefix tree (characters in vllm-router, "
        "content-block keys here; default: the policy's, 2**24)",
    )
    a(
        "--eviction-interval-secs",
        type=float,
        default=None,
        help="accepted for vllm-router compatibility: cache_aware trims a worker's tree to "
        "--max-tree-size after each insert, not on a timer",
    )
    add_rate_limit_arguments(parser)
    a("--disable-retries", action="store_true", help="one attempt per request")
    a("--disable-circuit-breaker", action="store_true", help="never open a worker's circuit")
    a(
        "--cb-keep-half-available",
        action="store_true",
        help="open a worker's circuit only while at least half of the workers stay available, "
        "so failures every worker shares (a bad request repeated) cannot switch the fleet off "
        "(sessionroute only; default: vllm-router's breaker, which opens even the last one)",
    )
    a(
        "--cb-half-open-on-recovery",
        action="store_true",
        help="when a worker that was unhealthy passes its health checks again, make its open "
        "circuit half-open at once, so requests probe it (sessionroute only; with several "
        "routers on one --state-url, a circuit one router opened during a crash otherwise "
        "keeps the worker away from it for --cb-timeout-duration-secs while the others use "
        "it, and sessions move between them; default: vllm-router's breaker)",
    )
    a(
        "--cb-window-duration-secs",
        type=float,
        default=None,
        help="accepted for vllm-router compatibility; the breaker counts consecutive failures",
    )
    a("--prometheus-port", type=int, default=None, help="also serve /metrics on this port")
    a("--api-key", default=None, help="bearer token sent to workers")
    a("--router-api-key", default=None, help="bearer token clients must send to the router")
    a(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error", "critical"],
        help="log level (default: %(default)s)",
    )
    add_hardening_arguments(parser)
    add_kv_arguments(parser)
    add_unsupported(parser)
