"""Validated router settings and the ``sessionroute serve`` command line.

The flags shared with vllm-router keep its names and defaults (vllm-router 0.1.17,
``shared/ROUTER.md``); ours are ``--session-headers``, ``--session-ttl-secs``,
``--session-sweep-interval-secs``, ``--router-api-key``, ``--shutdown-timeout-secs`` and
``--policy module:Class``. vllm-router options this router does not implement (PD
disaggregation, service discovery, rate limiting, ...) fail with a message naming them rather
than being silently ignored.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sessionroute.errors import ConfigError
from sessionroute.state import DEFAULT_SESSION_HEADERS

__all__ = [
    "DEFAULT_REQUEST_ID_HEADERS",
    "SESSION_TTL_ENV",
    "RouterSettings",
    "add_arguments",
    "settings_from_args",
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
    "--max-concurrent-requests": "admission control / rate limiting",
    "--queue-size": "admission control / rate limiting",
    "--queue-timeout-secs": "admission control / rate limiting",
    "--rate-limit-tokens-per-second": "admission control / rate limiting",
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


class RouterSettings(BaseModel):
    """Everything ``sessionroute serve`` needs, validated (seconds, bytes, counts as named).

    Raises:
        pydantic.ValidationError: on construction with an invalid value (the CLI turns it into
            :class:`~sessionroute.errors.ConfigError`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(30000, ge=0, le=65535)
    worker_urls: tuple[str, ...] = ()
    policy: str = "sticky_least_loaded"
    session_headers: tuple[str, ...] = DEFAULT_SESSION_HEADERS
    request_id_headers: tuple[str, ...] = DEFAULT_REQUEST_ID_HEADERS
    session_ttl_secs: float = Field(7200.0, gt=0)
    session_sweep_interval_secs: float = Field(60.0, gt=0)
    request_timeout_secs: float = Field(1800.0, gt=0)
    health_check_interval_secs: float = Field(60.0, gt=0)
    health_check_timeout_secs: float = Field(5.0, gt=0)
    health_failure_threshold: int = Field(3, ge=1)
    health_success_threshold: int = Field(2, ge=1)
    health_check_endpoint: str = "/health"
    retry_max_retries: int = Field(5, ge=1)
    retry_initial_backoff_ms: float = Field(50.0, ge=0)
    retry_max_backoff_ms: float = Field(30000.0, ge=0)
    retry_backoff_multiplier: float = Field(1.5, ge=1.0)
    retry_jitter_factor: float = Field(0.2, ge=0.0, le=1.0)
    disable_retries: bool = False
    cb_failure_threshold: int = Field(10, ge=1)
    cb_success_threshold: int = Field(3, ge=1)
    cb_timeout_duration_secs: float = Field(60.0, gt=0)
    disable_circuit_breaker: bool = False
    max_payload_size: int = Field(512 * 1024 * 1024, ge=1)
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int | None = Field(None, ge=0, le=65535)
    api_key: str | None = None
    router_api_key: str | None = None
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    cache_threshold: float = Field(0.3, ge=0.0, le=1.0)
    balance_abs_threshold: int = Field(64, ge=0)
    balance_rel_threshold: float = Field(1.5, ge=1.0)
    shutdown_timeout_secs: float = Field(30.0, ge=0)

    @field_validator("worker_urls")
    @classmethod
    def _check_urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"worker url must start with http:// or https://: {url!r}")
        if len(set(urls)) != len(urls):
            raise ValueError(f"duplicate worker url in {list(urls)}")
        return urls

    @field_validator("session_headers", "request_id_headers")
    @classmethod
    def _check_headers(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        out = tuple(n.strip().lower() for n in names)
        if any(not n or any(c.isspace() or c == ":" for c in n) for n in out):
            raise ValueError(f"invalid header name in {list(names)}")
        return out

    @field_validator("health_check_endpoint")
    @classmethod
    def _check_endpoint(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"health check endpoint must start with '/': {path!r}")
        return path

    @property
    def max_attempts(self) -> int:
        """Total upstream attempts per request (1 when retries are disabled)."""
        return 1 if self.disable_retries else self.retry_max_retries

    def policy_options(self, known: set[str]) -> dict[str, Any]:
        """Options for the policy's ``Config`` among ``known`` field names.

        ``session_ttl_secs`` maps to ``session_ttl_s``; ``cache_threshold`` and the two balance
        thresholds pass under their own names.
        """
        candidates: dict[str, Any] = {
            "session_ttl_s": self.session_ttl_secs,
            "cache_threshold": self.cache_threshold,
            "balance_abs_threshold": self.balance_abs_threshold,
            "balance_rel_threshold": self.balance_rel_threshold,
        }
        return {k: v for k, v in candidates.items() if k in known}

    @classmethod
    def build(cls, **values: Any) -> RouterSettings:
        """Validate ``values`` into settings.

        Raises:
            ConfigError: naming every invalid field and its value.
        """
        try:
            return cls(**values)
        except ValidationError as exc:
            parts = []
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"]) or "settings"
                parts.append(f"--{loc.replace('_', '-')}: {err['msg']} (got {err.get('input')!r})")
            raise ConfigError("invalid router settings: " + "; ".join(parts)) from None


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
    """Add every ``serve`` flag to ``parser`` (defaults shown by ``--help``)."""
    d = RouterSettings.model_fields
    a = parser.add_argument
    a("--host", default=d["host"].default, help="address to bind (default: %(default)s)")
    a("--port", type=int, default=d["port"].default, help="port to bind (default: %(default)s)")
    a("--worker-urls", nargs="*", default=[], metavar="URL", help="worker base URLs")
    a(
        "--policy",
        default=d["policy"].default,
        help="routing policy: round_robin, random, power_of_two, cache_aware, consistent_hash, "
        "sticky_least_loaded, least_loaded, consistent_hash_bounded_load, or "
        "package.module:Class (default: %(default)s)",
    )
    a(
        "--session-headers",
        nargs="+",
        default=list(DEFAULT_SESSION_HEADERS),
        metavar="H",
        help="headers carrying the session id, checked in order (default: x-session-id)",
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
        default=d["session_sweep_interval_secs"].default,
        help="seconds between background sweeps of idle sessions (default: %(default)s)",
    )
    for name, typ, help_text in (
        ("request_timeout_secs", float, "upstream request timeout, seconds"),
        ("health_check_interval_secs", float, "seconds between health checks"),
        ("health_check_timeout_secs", float, "health check timeout, seconds"),
        ("health_failure_threshold", int, "consecutive failed checks before unhealthy"),
        ("health_success_threshold", int, "consecutive passed checks before healthy"),
        ("health_check_endpoint", str, "health check path"),
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
        ("balance_abs_threshold", int, "cache_aware: absolute load imbalance trigger"),
        ("balance_rel_threshold", float, "cache_aware: relative load imbalance trigger"),
        ("shutdown_timeout_secs", float, "seconds in-flight requests get on shutdown"),
    ):
        a(
            "--" + name.replace("_", "-"),
            type=typ,
            default=d[name].default,
            help=f"{help_text} (default: %(default)s)",
        )
    a("--disable-retries", action="store_true", help="one attempt per request")
    a("--disable-circuit-breaker", action="store_true", help="never open a worker's circuit")
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
    for flag in _UNSUPPORTED_VLLM_ROUTER_FLAGS:
        a(flag, action=_Unsupported, dest="unsupported_" + flag.strip("-").replace("-", "_"))


def settings_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> RouterSettings:
    """Validated settings from parsed ``serve`` arguments.

    The session TTL is ``--session-ttl-secs`` if given, else ``$VLLM_ROUTER_SLL_SESSION_
    EXPIRATION_IN_S``, else 7200 seconds.

    Raises:
        ConfigError: on any invalid value (named with the value), including a bad TTL variable.
    """
    env = os.environ if environ is None else environ
    ttl = args.session_ttl_secs
    if ttl is None:
        raw = env.get(SESSION_TTL_ENV)
        if raw:
            try:
                ttl = float(raw)
            except ValueError:
                raise ConfigError(f"{SESSION_TTL_ENV} must be a number, got {raw!r}") from None
        else:
            ttl = 7200.0
    values: dict[str, Any] = {
        name: getattr(args, name)
        for name in RouterSettings.model_fields
        if name not in ("session_ttl_secs", "request_id_headers", "worker_urls", "session_headers")
    }
    values["session_ttl_secs"] = ttl
    values["worker_urls"] = tuple(args.worker_urls or ())
    values["session_headers"] = tuple(args.session_headers)
    if args.request_id_headers:
        values["request_id_headers"] = tuple(args.request_id_headers)
    return RouterSettings.build(**values)
