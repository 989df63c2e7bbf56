"""Defaults of the ``sessionroute serve`` flags.

The router core's settings take their defaults from
:class:`~sessionroute.router.config.RouterConfig`, the one place they are written
(:data:`ROUTER_FLAGS` maps each flag to its field and units); the rest are the HTTP server's,
vllm-router 0.1.17's where the flag is shared (``shared/ROUTER.md``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sessionroute.router.config import RouterConfig
from sessionroute.router.policies.cache_aware import CacheAwareConfig

__all__ = ["DEFAULTS", "DEFAULT_REQUEST_ID_HEADERS", "ROUTER_FLAGS", "SESSION_TTL_ENV"]

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
    "request_timeout_secs": ("request_timeout_s", 1.0),
    "first_byte_timeout_secs": ("first_byte_timeout_s", 1.0),
    "worker_startup_timeout_secs": ("worker_startup_timeout_s", 1.0),
    "worker_startup_check_interval": ("worker_startup_check_interval_s", 1.0),
}
"""The ``serve`` settings that are router core settings: flag name -> (:class:`RouterConfig`
field, flag units per field unit: 1000 for a flag in milliseconds of a field in seconds). The
flags' defaults are the fields' (:data:`DEFAULTS`), and
:meth:`~sessionroute.serve.config.RouterSettings.router_config` maps the values back."""


def _router_default(flag: str) -> Any:
    field, scale = ROUTER_FLAGS[flag]
    value = RouterConfig.model_fields[field].default
    return value * scale if isinstance(scale, float) and value is not None else value


_CACHE_AWARE: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(CacheAwareConfig)}
"""``cache_aware``'s option defaults: those of ``--cache-threshold`` and the two balance
thresholds (vllm-router's), written once, in the policy's ``Config``."""

DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1",
    "port": 30000,
    "policy": "sticky_least_loaded",
    "health_check_endpoint": "/health",
    "max_payload_size": 512 * 1024 * 1024,
    "prometheus_host": "127.0.0.1",
    "log_level": "info",
    "cache_threshold": _CACHE_AWARE["cache_threshold"],
    "balance_abs_threshold": _CACHE_AWARE["balance_abs_threshold"],
    "balance_rel_threshold": _CACHE_AWARE["balance_rel_threshold"],
    "shutdown_timeout_secs": 30.0,
    "state_url": None,
    "state_key_prefix": "sessionroute",
    "state_lease_secs": 10.0,
    "state_timeout_secs": 0.5,
    "max_connections": 10000,
    "header_timeout_secs": 10.0,
    "idle_timeout_secs": 30.0,
    "kv_block_size": 16,
    "kv_hash_algo": "sha256",
    **{flag: _router_default(flag) for flag in ROUTER_FLAGS},
}
"""Defaults of the ``serve`` flags (vllm-router 0.1.17's where the flag is shared); those of
the router core's settings come from :class:`RouterConfig` (:data:`ROUTER_FLAGS`), the one
place they are written."""
