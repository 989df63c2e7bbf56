"""``sessionroute serve`` command line: flags, validation, env TTL, a real subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

import aiohttp
import pytest

from sessionroute.cli import build_parser, main
from sessionroute.errors import ConfigError
from sessionroute.router.config import RouterConfig
from sessionroute.serve.config import SESSION_TTL_ENV, router_flags, settings_from_args
from sessionroute.serve.flags import ROUTER_FLAGS

from .backend import FakeBackend


def _parse(*argv: str) -> object:
    return build_parser().parse_args(["serve", *argv])


def test_vllm_router_flags_map_to_settings() -> None:
    args = _parse(
        "--host", "0.0.0.0", "--port", "8080",
        "--worker-urls", "http://a:1", "http://b:2",
        "--policy", "consistent_hash",
        "--request-id-headers", "x-trace-id",
        "--request-timeout-secs", "30",
        "--health-check-interval-secs", "5",
        "--health-check-timeout-secs", "2",
        "--health-failure-threshold", "4",
        "--health-success-threshold", "1",
        "--health-check-endpoint", "/ping",
        "--retry-max-retries", "2",
        "--retry-initial-backoff-ms", "10",
        "--retry-max-backoff-ms", "100",
        "--retry-backoff-multiplier", "2",
        "--retry-jitter-factor", "0.1",
        "--cb-failure-threshold", "7",
        "--cb-success-threshold", "2",
        "--cb-timeout-duration-secs", "9",
        "--cb-window-duration-secs", "120",
        "--max-payload-size", "1024",
        "--prometheus-host", "127.0.0.2",
        "--prometheus-port", "29001",
        "--api-key", "wk",
        "--log-level", "warning",
        "--cache-threshold", "0.5",
        "--balance-abs-threshold", "32",
        "--balance-rel-threshold", "1.2",
        "--session-headers", "X-Session-Id", "x-user-id",
        "--session-ttl-secs", "60",
        "--router-api-key", "rk",
    )  # fmt: skip
    s = settings_from_args(args, environ={})  # type: ignore[arg-type]
    assert s.worker_urls == ("http://a:1", "http://b:2")
    assert (s.host, s.port, s.policy) == ("0.0.0.0", 8080, "consistent_hash")
    assert s.request_id_headers == ("x-trace-id",)
    assert s.session_headers == ("x-session-id", "x-user-id")
    assert (s.health_failure_threshold, s.health_check_endpoint) == (4, "/ping")
    rc = s.router_config()
    assert (s.retry_max_retries, s.retry_backoff_multiplier, rc.retry_max_attempts) == (2, 2.0, 2)
    assert (s.cb_failure_threshold, s.cb_timeout_duration_secs) == (7, 9.0)
    assert (s.prometheus_port, s.api_key, s.router_api_key) == (29001, "wk", "rk")
    assert (s.session_ttl_secs, s.log_level, s.max_payload_size) == (60.0, "warning", 1024)
    assert (rc.session_ttl_s, rc.session_headers, rc.cb_failure_threshold) == (
        60.0, ("x-session-id", "x-user-id"), 7,
    )  # fmt: skip
    assert s.policy_options() == {}  # sticky_least_loaded takes none of the flag options
    cache = settings_from_args(_parse("--policy", "cache_aware", "--cache-threshold", "0.5"))  # type: ignore[arg-type]
    assert cache.policy_options() == {
        "cache_threshold": 0.5,
        "balance_abs_threshold": 64,
        "balance_rel_threshold": 1.5,
    }


def test_defaults_and_env_ttl() -> None:
    s = settings_from_args(_parse(), environ={})  # type: ignore[arg-type]
    assert (s.port, s.retry_max_retries, s.cb_failure_threshold, s.session_ttl_secs) == (
        30000, 5, 10, 7200.0,
    )  # fmt: skip
    assert s.router_config().retry_max_attempts == 5
    no_retries = settings_from_args(_parse("--disable-retries"), environ={})  # type: ignore[arg-type]
    assert no_retries.router_config().retry_max_attempts == 1
    env = {SESSION_TTL_ENV: "120"}
    assert settings_from_args(_parse(), environ=env).session_ttl_secs == 120.0  # type: ignore[arg-type]
    flag = _parse("--session-ttl-secs", "5")
    assert settings_from_args(flag, environ=env).session_ttl_secs == 5.0  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=SESSION_TTL_ENV):
        settings_from_args(_parse(), environ={SESSION_TTL_ENV: "soon"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--vllm-pd-disaggregation"], "does not support (prefill/decode disaggregation)"),
        (["--service-discovery"], "does not support (Kubernetes service discovery"),
        (["--sess", "x"], "unrecognized arguments"),  # no silent prefix matching
    ],
)
def test_unknown_and_unsupported_flags_fail_clearly(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert len(err.splitlines()) == 2 and "see --help" in err  # short usage, then the error


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--retry-jitter-factor", "2"], "--retry-jitter-factor"),
        (["--worker-urls", "ftp://x"], "http://"),
        (["--policy", "nope"], "unknown policy 'nope'"),
        (["--health-check-endpoint", "health"], "must start with '/'"),
    ],
)
def test_invalid_values_exit_2_naming_them(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", *argv]) == 2
    assert needle in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_serve_subprocess_and_sigterm(
    backends: list[FakeBackend], client: aiohttp.ClientSession
) -> None:
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sessionroute.cli", "serve",
        "--port", str(port), "--worker-urls", backends[0].url, "--log-level", "warning",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(400):  # wait for the listener (bounded)
            try:
                async with client.get(url + "/liveness") as r:
                    if r.status == 200:
                        break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.025)
        async with client.post(
            url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            headers={"x-session-id": "p"},
        ) as r:
            assert r.status == 200
        assert backends[0].sessions() == ["p"]
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 20)
    assert rc == 0


@pytest.mark.parametrize(
    "config",
    [
        RouterConfig(),
        RouterConfig(
            session_headers=("x-rollout", "x-user-id"),
            session_ttl_s=30.5,
            sweep_interval_s=7.0,
            retry_max_attempts=2,
            retry_backoff_s=0.25,
            retry_backoff_multiplier=3.0,
            retry_max_backoff_s=4.0,
            retry_jitter_factor=0.0,
            circuit_breaker=False,
            cb_failure_threshold=4,
            cb_success_threshold=1,
            cb_timeout_s=12.0,
            scrape_interval_s=None,
            content_block_tokens=64,
            admission_max_waiting=5,
            admission_max_wait_s=2.5,
        ),
    ],
)
def test_router_flags_give_back_the_same_router_config(config: RouterConfig) -> None:
    """``compare --live`` starts its routers with ``router_flags(config)``: one config, both
    worlds."""
    args = _parse("--worker-urls", "http://a:1", *router_flags(config))
    assert settings_from_args(args, environ={}).router_config() == config  # type: ignore[arg-type]


def test_help_lists_every_built_in_policy(capsys: pytest.CaptureFixture[str]) -> None:
    from sessionroute.router.policies.registry import policy_names

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    listed = text.split("--policy POLICY routing policy:")[1].split("(default")[0]
    assert set(policy_names()) <= set(listed.replace(",", " ").split())
    assert {"adaptive_sticky", "kv_aware"} <= set(listed.replace(",", " ").split())


def test_the_router_defaults_are_written_once_and_the_flags_follow_them() -> None:
    """Drift check: the router core's defaults live in RouterConfig only. ``serve`` with no
    flag runs exactly ``RouterConfig()``; every setting of it has a flag (or is the session
    header list or the circuit switch); and ``router_flags`` gives back any config."""
    parser = build_parser()
    args = parser.parse_args(["serve"])
    assert settings_from_args(args, environ={}).router_config() == RouterConfig()
    fields = {field for field, _ in ROUTER_FLAGS.values()}
    own_flags = {  # each has a flag of its own shape (a list, a switch, vllm-router's limits)
        "session_headers",
        "session_body_fields",
        "circuit_breaker",
        "cb_keep_half_available",
        "cb_half_open_on_recovery",
        "rate_limit_capacity",
        "rate_limit_per_s",
    }
    assert fields | own_flags == set(RouterConfig.model_fields)
    odd = RouterConfig(
        retry_after_send=False,
        health_check_interval_s=7.5,
        health_failure_threshold=4,
        retry_backoff_s=0.25,
        sweep_interval_s=30.0,
        circuit_breaker=False,
        session_body_fields=("user",),
        cb_keep_half_available=True,
        cb_half_open_on_recovery=True,
        rate_limit_capacity=5,
        rate_limit_per_s=2.0,
    )
    again = parser.parse_args(["serve", *router_flags(odd)])
    assert settings_from_args(again, environ={}).router_config() == odd


def test_policy_and_session_table_defaults_come_from_one_place() -> None:
    """Drift check: ``--cache-threshold`` and the balance thresholds default to
    ``cache_aware``'s own option defaults, and the session TTL and table cap that ``serve``,
    the shared table and every session policy use are the session table's."""
    import dataclasses

    from sessionroute.router.policies.cache_aware import CacheAwareConfig
    from sessionroute.router.policies.registry import policy_class
    from sessionroute.router.state.sessions import (
        DEFAULT_MAX_SESSIONS,
        DEFAULT_TTL_S,
        SessionTable,
    )

    s = settings_from_args(_parse("--policy", "cache_aware"), environ={})  # type: ignore[arg-type]
    own = {f.name: f.default for f in dataclasses.fields(CacheAwareConfig)}
    assert s.policy_options() == {k: own[k] for k in s.policy_options()}
    assert s.session_ttl_secs == RouterConfig().session_ttl_s == DEFAULT_TTL_S
    table = SessionTable()
    assert (table.ttl_s, table.max_sessions) == (DEFAULT_TTL_S, DEFAULT_MAX_SESSIONS)
    for name in ("sticky_least_loaded", "consistent_hash_bounded_load", "adaptive_sticky"):
        config = policy_class(name).Config
        assert config is not None and dataclasses.is_dataclass(config)
        defaults = {f.name: f.default for f in dataclasses.fields(config)}
        assert defaults["session_ttl_s"] == DEFAULT_TTL_S, name
        assert defaults["max_sessions"] == DEFAULT_MAX_SESSIONS, name
