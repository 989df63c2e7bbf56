"""The ``sessionroute serve`` command line (argparse only; cheap to import).

The flags shared with vllm-router keep its names and defaults (vllm-router 0.1.17,
``shared/ROUTER.md``); ours are ``--session-headers``, ``--session-ttl-secs``,
``--session-sweep-interval-secs``, ``--router-api-key``, ``--shutdown-timeout-secs`` and
``--policy module:Class``. vllm-router options this router does not implement (PD
disaggregation, service discovery, rate limiting, ...) fail with a message naming them rather
than being silently ignored. Validation lives in :mod:`sessionroute.serve.config`.
"""

from __future__ import annotations

import argparse
from typing import Any

from sessionroute.router.config import DEFAULT_SESSION_HEADERS, RouterConfig
from sessionroute.router.policies.registry import policy_names
from sessionroute.router.session_keys import DEFAULT_SESSION_BODY_FIELDS

__all__ = [
    "DEFAULTS",
    "DEFAULT_REQUEST_ID_HEADERS",
    "ROUTER_FLAGS",
    "SESSION_TTL_ENV",
    "add_arguments",
]

SESSION_TTL_ENV = "VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S"
"""vllm-router's environment variable for the ``sticky_least_loaded`` session TTL (seconds)."""

DEFAULT_REQUEST_ID_HEADERS: tuple[str, ...] = (
    "x-request-id",
    "x-correlation-id",
    "x-trace-id",
    "request-id",
)
"""Headers whose value is echoed as the response's ``x-request-id`` (vllm-router's defaults)."""

ROUTER_FLAGS: dict[str, tuple[str, float]] = {
    "session_ttl_secs": ("session_ttl_s", 1.0),
    "session_sweep_interval_secs": ("sweep_interval_s", 1.0),
    "health_check_interval_secs": ("health_check_interval_s", 1.0),
    "health_recheck_interval_secs": ("health_recheck_interval_s", 1.0),
    "health_check_timeout_secs": ("health_check_timeout_s", 1.0),
    "health_failure_threshold": ("health_failure_threshold", 1),
    "health_success_threshold": ("health_success_threshold", 1),
    "retry_max_retries": ("retry_max_attempts", 1),
    "retry_initial_backoff_ms": ("retry_backoff_s", 1000.0),
    "retry_max_backoff_ms": ("retry_max_backoff_s", 1000.0),
    "retry_backoff_multiplier": ("retry_backoff_multiplier", 1.0),
    "retry_jitter_factor": ("retry_jitter_factor", 1.0),
    "cb_failure_threshold": ("cb_failure_threshold", 1),
    "cb_success_threshold": ("cb_success_threshold", 1),
    "cb_timeout_duration_secs": ("cb_timeout_s", 1.0),
    "scrape_interval_secs": ("scrape_interval_s", 1.0),
    "content_block_tokens": ("content_block_tokens", 1),
    "admission_max_waiting": ("admission_max_waiting", 1),
    "admission_max_wait_secs": ("admission_max_wait_s", 1.0),
    "max_session_id_bytes": ("max_session_id_bytes", 1),
    "session_table_max_bytes": ("session_table_max_bytes", 1),
    "retry_after_send": ("retry_after_send", 1),
}
"""The ``serve`` settings that are router core settings: flag name -> (:class:`RouterConfig`
field, flag units per field unit: 1000 for a flag in milliseconds of a field in seconds). The
flags' defaults are the fields' (:data:`DEFAULTS`), and
:meth:`~sessionroute.serve.config.RouterSettings.router_config` maps the values back."""


def _router_default(flag: str) -> Any:
    field, scale = ROUTER_FLAGS[flag]
    value = RouterConfig.model_fields[field].default
    return value * scale if isinstance(scale, float) and value is not None else value


DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1",
    "port": 30000,
    "policy": "sticky_least_loaded",
    "request_timeout_secs": 1800.0,
    "health_check_endpoint": "/health",
    "max_payload_size": 512 * 1024 * 1024,
    "prometheus_host": "127.0.0.1",
    "log_level": "info",
    "cache_threshold": 0.3,
    "balance_abs_threshold": 64,
    "balance_rel_threshold": 1.5,
    "shutdown_timeout_secs": 30.0,
    "state_url": None,
    "state_key_prefix": "sessionroute",
    "state_lease_secs": 10.0,
    "state_timeout_secs": 0.5,
    "first_byte_timeout_secs": 0.0,
    "max_connections": 10000,
    "header_timeout_secs": 10.0,
    "idle_timeout_secs": 30.0,
    "kv_block_size": 16,
    "kv_hash_algo": "sha256",
    "worker_startup_timeout_secs": 600.0,
    "worker_startup_check_interval": 30.0,
    **{flag: _router_default(flag) for flag in ROUTER_FLAGS},
}
"""Defaults of the ``serve`` flags (vllm-router 0.1.17's where the flag is shared); those of
the router core's settings come from :class:`RouterConfig` (:data:`ROUTER_FLAGS`), the one
place they are written."""


_UNSUPPORTED_VLLM_ROUTER_FLAGS: dict[str, str] = {
    "--vllm-pd-disaggregation": "prefill/decode disaggregation",
    "--prefill": "prefill/decode disaggregation",
    "--decode": "prefill/decode disaggregation",
    "--prefill-policy": "prefill/decode disaggregation",
    "--decode-policy": "prefill/decode disaggregation",
    "--pd-kv-events": "prefill/decode disaggregation",
    "--kv-connector": "prefill/decode disaggregation",
    "--vllm-discovery-address": "prefill/decode disaggregation",
    "--mini-lb": "MiniLB",
    "--enable-program-scheduling": "program scheduling",
    "--program-scheduling-config-json": "program scheduling",
    "--service-discovery": "Kubernetes service discovery",
    "--selector": "Kubernetes service discovery",
    "--prefill-selector": "Kubernetes service discovery",
    "--decode-selector": "Kubernetes service discovery",
    "--service-discovery-port": "Kubernetes service discovery",
    "--service-discovery-namespace": "Kubernetes service discovery",
    "--enable-igw": "multi-model gateway mode",
    "--intra-node-data-parallel-size": "data-parallel-aware routing",
    "--wasm-middleware": "WASM middleware",
    "--wasm-middleware-sha256": "WASM middleware",
    "--wasm-middleware-route": "WASM middleware",
    "--cors-allowed-origins": "CORS",
    "--kv-event-source": "kv_aware routing",
    "--kv-event-replay-source": "kv_aware routing",
    "--kv-event-block-size": "kv_aware routing",
    "--kv-event-model": "kv_aware routing",
    "--kv-aware-session-affinity-ttl-secs": "kv_aware routing",
    "--router-temperature": "kv_aware routing",
    "--kv-penalty-host": "kv_aware routing",
    "--kv-penalty-external": "kv_aware routing",
    "--kv-penalty-disk": "kv_aware routing",
    "--log-dir": "log files (logs go to stderr)",
}


class _Unsupported(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs["nargs"] = "*"
        kwargs["help"] = argparse.SUPPRESS
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        feature = _UNSUPPORTED_VLLM_ROUTER_FLAGS.get(option_string or "", "this feature")
        parser.error(
            f"{option_string} is a vllm-router option that sessionroute serve does not "
            f"support ({feature})"
        )


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
        help=f"idle seconds before a session expires (default: ${SESSION_TTL_ENV} or 7200)",
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
    limits = parser.add_argument_group(
        "rate limit (vllm-router's)",
        "A token bucket in front of placement: each proxied request takes a token and gives it "
        "back when it completes; without one it waits in the queue (FIFO). Refused: 429 with "
        "Retry-After: 1 when the queue is full, 408 when the wait times out. Off unless "
        "--max-concurrent-requests or --rate-limit-tokens-per-second is given (vllm-router's "
        "default, 32768, never limits in practice).",
    )
    limits.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=None,
        help="the bucket's capacity (vllm-router's default: 32768)",
    )
    limits.add_argument(
        "--rate-limit-tokens-per-second",
        type=float,
        default=None,
        help="tokens added per second (default: --max-concurrent-requests)",
    )
    limits.add_argument(
        "--queue-size",
        type=int,
        default=None,
        help="requests that may wait for a token (0: refuse at once; default 100 with the "
        "limit, else --admission-max-waiting)",
    )
    limits.add_argument(
        "--queue-timeout-secs",
        type=float,
        default=None,
        help="longest wait in the queue (default: --admission-max-wait-secs, 60)",
    )
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
    _add_hardening_arguments(parser)
    kv = parser.add_argument_group(
        "kv_aware (sessionroute only)",
        "The replicas' prefix caches, learned from vLLM's KV cache events (docs/kv_aware.md). "
        'Start each vLLM server with --kv-events-config \'{"enable_kv_cache_events": true, '
        '"publisher": "zmq", "endpoint": "tcp://ROUTER_HOST:PORT"}\' (and optionally '
        '"replay_endpoint": "tcp://*:RPORT"); give the router the same address per worker.',
    )
    kv.add_argument(
        "--kv-events",
        action="append",
        default=[],
        metavar="URL=ENDPOINT[,REPLAY]",
        help="worker URL, the ZMQ address the router binds for its KV events, and optionally "
        "the server's replay address (repeatable, one per worker)",
    )
    kv.add_argument(
        "--kv-tokenizer",
        default=None,
        metavar="DIR",
        help="local model directory with the servers' tokenizer.json and chat template: "
        "requests are tokenized and hashed into vLLM block hashes (without it kv_aware "
        "matches nothing and routes by load alone); 'emulator': the tokenizer of "
        "sessionroute emulate",
    )
    kv.add_argument(
        "--kv-block-size",
        type=int,
        default=d["kv_block_size"],
        help="the servers' --block-size (default: %(default)s)",
    )
    kv.add_argument(
        "--kv-hash-algo",
        default=d["kv_hash_algo"],
        choices=["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"],
        help="the servers' --prefix-caching-hash-algo (default: %(default)s)",
    )
    kv.add_argument(
        "--kv-hash-seed",
        default=None,
        metavar="SEED",
        help="the servers' PYTHONHASHSEED, if they run with one (required for xxhash)",
    )
    for flag in _UNSUPPORTED_VLLM_ROUTER_FLAGS:
        a(flag, action=_Unsupported, dest="unsupported_" + flag.strip("-").replace("-", "_"))


def _add_hardening_arguments(parser: argparse.ArgumentParser) -> None:
    """Limits, failure handling and admin access (sessionroute only; issue 19)."""
    d = DEFAULTS
    a = parser.add_argument
    a(
        "--max-session-id-bytes",
        type=int,
        default=d["max_session_id_bytes"],
        help="longest session id accepted; a longer one, or one with a control character, "
        "is a 400 before placement (default: %(default)s)",
    )
    a(
        "--session-table-max-bytes",
        type=int,
        default=d["session_table_max_bytes"],
        help="capacity of the session table in estimated bytes (each entry: its session "
        "id's length + 256); past it the least recently used session is evicted, as past "
        "the entry cap (policy option max_sessions) (default: %(default)s, 256 MiB)",
    )
    a(
        "--first-byte-timeout-secs",
        type=float,
        default=d["first_byte_timeout_secs"],
        help="a streaming request whose worker sends no response head within this many "
        "seconds is cancelled there and placed again (a hung worker); 0 disables "
        "(default: %(default)s)",
    )
    a(
        "--retry-after-send",
        action=argparse.BooleanOptionalAction,
        default=d["retry_after_send"],
        help="retry a request whose worker connection broke after the request was fully "
        "sent, before any byte reached the client, as vllm-router does (a worker that "
        "crashed mid-request); --no-retry-after-send retries only requests that provably "
        "did not reach the worker, so none runs twice (default: %(default)s)",
    )
    a(
        "--max-connections",
        type=int,
        default=d["max_connections"],
        help="most client connections at once; more are closed at once and counted "
        "(default: %(default)s)",
    )
    a(
        "--header-timeout-secs",
        type=float,
        default=d["header_timeout_secs"],
        help="a client must send a whole request head, and keep its body coming, within "
        "this many seconds, or its connection is closed and counted (default: %(default)s)",
    )
    a(
        "--idle-timeout-secs",
        type=float,
        default=d["idle_timeout_secs"],
        help="idle keep-alive client connections are closed after this many seconds "
        "(default: %(default)s)",
    )
    a(
        "--allow-remote-admin",
        action="store_true",
        help="without --router-api-key, let clients other than loopback ones use the admin "
        "routes (/add_worker, /remove_worker, /sessions/ID); with a key they need the key",
    )
    a(
        "--route-receipts",
        action="store_true",
        help="add an x-sessionroute-route header to each proxied response naming the policy, "
        "the worker, the reason (new, sticky, repinned, moved, stateless), the session and "
        "its origin, and the wait at the router (off: no cost)",
    )
    a(
        "--usage-metrics",
        action="store_true",
        help="count prompt and cached prompt tokens per worker from the usage of complete "
        "JSON answers (sessionroute_worker_prompt_tokens_total, ..._cached_prompt_tokens_total; "
        "streamed answers are not scanned)",
    )
    a(
        "--route-receipts-log",
        default=None,
        metavar="PATH",
        help="with --route-receipts, also append each receipt as a JSON line to PATH "
        "('-': standard error)",
    )
    a(
        "--expose-worker-header",
        action="store_true",
        help="name the worker that served each proxied request in an x-sessionroute-worker "
        "response header",
    )
