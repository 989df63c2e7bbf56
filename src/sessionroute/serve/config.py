"""Validated router settings (pydantic) built from the ``sessionroute serve`` command line.

The flags shared with vllm-router keep its names and defaults (vllm-router 0.1.17,
``shared/ROUTER.md``); ours are ``--session-headers``, ``--session-ttl-secs``,
``--session-sweep-interval-secs``, ``--router-api-key``, ``--shutdown-timeout-secs`` and
``--policy module:Class``. vllm-router options this router does not implement (PD
disaggregation, service discovery, rate limiting, ...) fail with a message naming them rather
than being silently ignored.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sessionroute.errors import ConfigError
from sessionroute.router.config import (
    DEFAULT_SESSION_HEADERS,
    VLLM_ROUTER_MAX_CONCURRENT,
    VLLM_ROUTER_QUEUE_SIZE,
    RouterConfig,
    header_names,
)
from sessionroute.router.policies.options import load_policy_file, parse_policy
from sessionroute.router.policies.registry import policy_class, takes_option
from sessionroute.router.session_keys import DEFAULT_SESSION_BODY_FIELDS
from sessionroute.router.validate import worker_url_problem
from sessionroute.serve.flag_defaults import (
    DEFAULT_REQUEST_ID_HEADERS,
    DEFAULTS,
    ROUTER_FLAGS,
    SESSION_TTL_ENV,
)
from sessionroute.serve.flags import add_arguments
from sessionroute.serve.kvstreams import KvStreamConfig, kv_streams

__all__ = [
    "DEFAULTS",
    "DEFAULT_REQUEST_ID_HEADERS",
    "SESSION_TTL_ENV",
    "KvStreamConfig",
    "RouterSettings",
    "add_arguments",
    "router_flags",
    "settings_from_args",
]


class RouterSettings(BaseModel):
    """Everything ``sessionroute serve`` needs, validated (seconds, bytes, counts as named).

    Raises:
        pydantic.ValidationError: on construction with an invalid value (the CLI turns it into
            :class:`~sessionroute.errors.ConfigError`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = DEFAULTS["host"]
    port: int = Field(DEFAULTS["port"], ge=0, le=65535)
    worker_urls: tuple[str, ...] = ()
    policy: str = DEFAULTS["policy"]
    session_headers: tuple[str, ...] = DEFAULT_SESSION_HEADERS
    session_body_fields: tuple[str, ...] = DEFAULT_SESSION_BODY_FIELDS
    request_id_headers: tuple[str, ...] = DEFAULT_REQUEST_ID_HEADERS
    session_ttl_secs: float = Field(DEFAULTS["session_ttl_secs"], gt=0)
    session_sweep_interval_secs: float = Field(DEFAULTS["session_sweep_interval_secs"], gt=0)
    request_timeout_secs: float = Field(DEFAULTS["request_timeout_secs"], gt=0)
    health_check_interval_secs: float = Field(DEFAULTS["health_check_interval_secs"], gt=0)
    health_recheck_interval_secs: float = Field(DEFAULTS["health_recheck_interval_secs"], gt=0)
    health_check_timeout_secs: float = Field(DEFAULTS["health_check_timeout_secs"], gt=0)
    health_failure_threshold: int = Field(DEFAULTS["health_failure_threshold"], ge=1)
    health_success_threshold: int = Field(DEFAULTS["health_success_threshold"], ge=1)
    health_check_endpoint: str = DEFAULTS["health_check_endpoint"]
    worker_startup_timeout_secs: float = Field(DEFAULTS["worker_startup_timeout_secs"], ge=0)
    worker_startup_check_interval: float = Field(DEFAULTS["worker_startup_check_interval"], gt=0)
    retry_max_retries: int = Field(DEFAULTS["retry_max_retries"], ge=1)
    retry_initial_backoff_ms: float = Field(DEFAULTS["retry_initial_backoff_ms"], ge=0)
    retry_max_backoff_ms: float = Field(DEFAULTS["retry_max_backoff_ms"], ge=0)
    retry_backoff_multiplier: float = Field(DEFAULTS["retry_backoff_multiplier"], ge=1.0)
    retry_jitter_factor: float = Field(DEFAULTS["retry_jitter_factor"], ge=0.0, le=1.0)
    disable_retries: bool = False
    cb_failure_threshold: int = Field(DEFAULTS["cb_failure_threshold"], ge=1)
    cb_success_threshold: int = Field(DEFAULTS["cb_success_threshold"], ge=1)
    cb_timeout_duration_secs: float = Field(DEFAULTS["cb_timeout_duration_secs"], gt=0)
    disable_circuit_breaker: bool = False
    cb_keep_half_available: bool = False
    cb_half_open_on_recovery: bool = False
    max_concurrent_requests: int | None = Field(None, ge=1)
    rate_limit_tokens_per_second: float | None = Field(None, gt=0)
    queue_size: int | None = Field(None, ge=0)
    queue_timeout_secs: float | None = Field(None, ge=0)
    max_tree_size: int | None = Field(None, ge=1)
    eviction_interval_secs: float | None = Field(None, gt=0)
    max_payload_size: int = Field(DEFAULTS["max_payload_size"], ge=1)
    prometheus_host: str = DEFAULTS["prometheus_host"]
    prometheus_port: int | None = Field(None, ge=0, le=65535)
    api_key: str | None = None
    router_api_key: str | None = None
    log_level: Literal["debug", "info", "warning", "error", "critical"] = DEFAULTS["log_level"]
    cache_threshold: float = Field(DEFAULTS["cache_threshold"], ge=0.0, le=1.0)
    balance_abs_threshold: int = Field(DEFAULTS["balance_abs_threshold"], ge=0)
    balance_rel_threshold: float = Field(DEFAULTS["balance_rel_threshold"], ge=1.0)
    shutdown_timeout_secs: float = Field(DEFAULTS["shutdown_timeout_secs"], ge=0)
    scrape_interval_secs: float = Field(DEFAULTS["scrape_interval_secs"], ge=0)
    content_block_tokens: int = Field(DEFAULTS["content_block_tokens"], ge=1)
    admission_max_waiting: int = Field(DEFAULTS["admission_max_waiting"], ge=0)
    admission_max_wait_secs: float = Field(DEFAULTS["admission_max_wait_secs"], ge=0)
    policy_option: tuple[str, ...] = ()
    policy_config: str | None = None
    objective: Literal["rl", "serving"] | None = None
    state_url: str | None = DEFAULTS["state_url"]
    state_key_prefix: str = Field(DEFAULTS["state_key_prefix"], min_length=1)
    state_lease_secs: float = Field(DEFAULTS["state_lease_secs"], gt=0)
    state_timeout_secs: float = Field(DEFAULTS["state_timeout_secs"], gt=0)
    max_session_id_bytes: int = Field(DEFAULTS["max_session_id_bytes"], ge=1)
    session_table_max_bytes: int = Field(DEFAULTS["session_table_max_bytes"], ge=1)
    first_byte_timeout_secs: float = Field(DEFAULTS["first_byte_timeout_secs"], ge=0)
    retry_after_send: bool = DEFAULTS["retry_after_send"]
    max_connections: int = Field(DEFAULTS["max_connections"], ge=1)
    header_timeout_secs: float = Field(DEFAULTS["header_timeout_secs"], gt=0)
    idle_timeout_secs: float = Field(DEFAULTS["idle_timeout_secs"], gt=0)
    allow_remote_admin: bool = False
    expose_worker_header: bool = False
    route_receipts: bool = False
    usage_metrics: bool = False
    route_receipts_log: str | None = None
    kv_events: tuple[str, ...] = ()
    kv_tokenizer: str | None = None
    kv_block_size: int = Field(DEFAULTS["kv_block_size"], ge=1)
    kv_hash_algo: Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"] = DEFAULTS[
        "kv_hash_algo"
    ]
    kv_hash_seed: str | None = None

    @field_validator("worker_urls")
    @classmethod
    def _check_urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        for url in urls:
            if problem := worker_url_problem(url):
                raise ValueError(problem)
        if len(set(urls)) != len(urls):
            raise ValueError(f"duplicate worker url in {list(urls)}")
        return urls

    @field_validator("state_url")
    @classmethod
    def _check_state_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a Redis URL: redis://HOST:PORT/DB, rediss://... or unix://")
        return url

    @field_validator("kv_events")
    @classmethod
    def _check_kv_events(cls, specs: tuple[str, ...]) -> tuple[str, ...]:
        kv_streams(specs)
        return specs

    def kv_streams(self) -> list[KvStreamConfig]:
        """The ``--kv-events`` streams, one per worker."""
        return kv_streams(self.kv_events)

    @field_validator("session_headers", "request_id_headers")
    @classmethod
    def _check_headers(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        return header_names(names)

    @field_validator("route_receipts_log")
    @classmethod
    def _check_receipts_log(cls, path: str | None) -> str | None:
        if path and path != "-" and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise ValueError(f"no directory for the receipts log {path!r}")
        return path

    @field_validator("session_body_fields")
    @classmethod
    def _check_body_fields(cls, fields: tuple[str, ...]) -> tuple[str, ...]:
        for f in fields:
            if not f or any(not part or part != part.strip() for part in f.split(".")):
                raise ValueError(f"a body field is a dotted path like a.b, got {f!r}")
        return fields

    @field_validator("health_check_endpoint")
    @classmethod
    def _check_endpoint(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"health check endpoint must start with '/': {path!r}")
        return path

    def router_config(self) -> RouterConfig:
        """The router core's settings (:data:`~sessionroute.serve.flags.ROUTER_FLAGS`:
        seconds where the flags say milliseconds; vllm-router's rate limit and queue flags
        (``--max-concurrent-requests``, ``--rate-limit-tokens-per-second``, ``--queue-size``,
        ``--queue-timeout-secs``) set the admission queue's limits when given)."""
        values: dict[str, Any] = {
            field: getattr(self, flag) / scale if isinstance(scale, float) else getattr(self, flag)
            for flag, (field, scale) in ROUTER_FLAGS.items()
        }
        if self.disable_retries:
            values["retry_max_attempts"] = 1
        values["scrape_interval_s"] = values["scrape_interval_s"] or None
        limited = (
            self.max_concurrent_requests is not None
            or self.rate_limit_tokens_per_second is not None
        )
        if self.queue_size is not None:
            values["admission_max_waiting"] = self.queue_size
        elif limited:
            values["admission_max_waiting"] = VLLM_ROUTER_QUEUE_SIZE
        if self.queue_timeout_secs is not None:
            values["admission_max_wait_s"] = self.queue_timeout_secs
        return RouterConfig(
            session_headers=self.session_headers,
            session_body_fields=self.session_body_fields,
            circuit_breaker=not self.disable_circuit_breaker,
            cb_keep_half_available=self.cb_keep_half_available,
            cb_half_open_on_recovery=self.cb_half_open_on_recovery,
            rate_limit_capacity=(self.max_concurrent_requests or VLLM_ROUTER_MAX_CONCURRENT)
            if limited
            else None,
            rate_limit_per_s=self.rate_limit_tokens_per_second,
            **values,
        )

    def _written_policy(self) -> tuple[str, dict[str, Any]]:
        """``--policy NAME(key=value, ...)`` and ``--policy-config FILE`` as a name and the
        options written with it (the inline ones win over the file's)."""
        name, inline = parse_policy(self.policy)
        if self.policy_config is None:
            return name, inline
        file_name, file_options = load_policy_file(self.policy_config)
        if self.policy != DEFAULTS["policy"] and name != file_name:
            raise ConfigError(
                f"--policy {self.policy!r} and --policy-config {self.policy_config!r} (policy "
                f"{file_name!r}) name different policies; give one"
            )
        return file_name, {**file_options, **inline}

    def policy_name(self) -> str:
        """The policy's registry name or ``module:Class``: ``--policy`` without its inline
        options, or the policy of ``--policy-config FILE``.

        Raises:
            ConfigError: for an unreadable ``--policy`` or policy file.
        """
        return self._written_policy()[0]

    def policy_options(self) -> dict[str, Any]:
        """The policy's options, each source overriding the ones before it: ``--cache-threshold``
        and the two balance thresholds (passed under their own names to a policy whose
        ``Config`` has them), the policy's options for ``--objective KIND``
        (``Policy.objective_options``), the options of ``--policy-config FILE``, the inline
        options of ``--policy NAME(key=value, ...)``, then every ``--policy-option KEY=VALUE``
        (the session TTL is given by :func:`~sessionroute.router.choose_policy`).

        Raises:
            ConfigError: a ``--policy-option`` without ``=`` or with an empty key, or an
                unreadable ``--policy`` or policy file.
        """
        name, written = self._written_policy()
        cls = policy_class(name)
        candidates: dict[str, Any] = {  # and --max-tree-size when given
            "cache_threshold": self.cache_threshold,
            "balance_abs_threshold": self.balance_abs_threshold,
            "balance_rel_threshold": self.balance_rel_threshold,
        }
        if self.max_tree_size is not None:
            candidates["max_tree_size"] = self.max_tree_size
        options = {k: v for k, v in candidates.items() if takes_option(cls, k)}
        if self.objective is not None:
            options.update(cls.objective_options.get(self.objective, {}))
        options.update(written)
        options.update(parse_policy_options(self.policy_option))
        return options

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


def settings_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> RouterSettings:
    """Validated settings from parsed ``serve`` arguments.

    The session TTL is ``--session-ttl-secs`` if given, else ``$VLLM_ROUTER_SLL_SESSION_
    EXPIRATION_IN_S``, else ``RouterConfig.session_ttl_s``'s default (7200 seconds).

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
            ttl = DEFAULTS["session_ttl_secs"]
    values: dict[str, Any] = {
        name: getattr(args, name)
        for name in RouterSettings.model_fields
        if name
        not in (
            "session_ttl_secs",
            "request_id_headers",
            "worker_urls",
            "session_headers",
            "session_body_fields",
            "policy_option",
            "kv_events",
        )
        and hasattr(args, name)
    }
    values["kv_events"] = tuple(getattr(args, "kv_events", None) or ())
    values["session_ttl_secs"] = ttl
    values["worker_urls"] = tuple(args.worker_urls or ())
    values["session_headers"] = tuple(args.session_headers)
    fields = getattr(args, "session_body_fields", None)
    values["session_body_fields"] = DEFAULT_SESSION_BODY_FIELDS if fields is None else tuple(fields)
    values["policy_option"] = tuple(args.policy_option or ())
    if args.request_id_headers:
        values["request_id_headers"] = tuple(args.request_id_headers)
    return RouterSettings.build(**values)


def parse_policy_options(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings as options: VALUE as JSON when it parses, else the string.

    Raises:
        ConfigError: naming an item without ``=`` or with an empty key.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--policy-option must be KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def router_flags(config: RouterConfig) -> list[str]:
    """``sessionroute serve`` flags that give a router exactly ``config`` (the inverse of
    :meth:`RouterSettings.router_config`; used by ``compare --live`` to start its routers).

    ``sweep_interval_s = None`` (no background sweep) has no flag: the router then sweeps
    every 60 s, which only changes when idle sessions are counted as expired.
    """
    flags = ["--session-headers", *config.session_headers]
    flags += ["--session-body-fields", *config.session_body_fields]
    for flag, (field, scale) in ROUTER_FLAGS.items():
        value = getattr(config, field)
        name = "--" + flag.replace("_", "-")
        if isinstance(value, bool):
            flags.append(name if value else "--no-" + name[2:])
        elif field == "scrape_interval_s":
            flags += [name, repr(value or 0.0)]
        elif value is None:  # sweep_interval_s: no flag
            continue
        elif isinstance(scale, float):
            flags += [name, repr(value * scale)]
        else:
            flags += [name, str(value)]
    if not config.circuit_breaker:
        flags.append("--disable-circuit-breaker")
    if config.cb_keep_half_available:
        flags.append("--cb-keep-half-available")
    if config.cb_half_open_on_recovery:
        flags.append("--cb-half-open-on-recovery")
    if config.rate_limit_capacity is not None:
        flags += ["--max-concurrent-requests", str(config.rate_limit_capacity)]
        flags += ["--queue-size", str(config.admission_max_waiting)]
    if config.rate_limit_per_s is not None:
        flags += ["--rate-limit-tokens-per-second", repr(config.rate_limit_per_s)]
    return flags
