"""One router configuration, read by ``sessionroute serve`` and by experiment files.

:class:`RouterConfig` holds every setting of the sans-I/O router (session identity, session
TTL and sweeps, the retry schedule, the content form policies see, admission). ``serve``
builds it from its command line (:meth:`sessionroute.serve.config.RouterSettings.router_config`,
milliseconds converted to seconds there); an experiment file's ``[router]`` table is
validated into :class:`sessionroute.sim.spec.RouterSection`, a subclass that adds what the
simulated *clients* do. The policy is chosen separately, by a typed
:class:`~sessionroute.router.policies.registry.PolicyChoice` (the policy name string exists
only at the CLI and TOML edges).

Defaults are vllm-router 0.1.17's where it has the setting (``shared/ROUTER.md``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sessionroute.router.session_keys import AGENT_SESSION_HEADERS, DEFAULT_SESSION_BODY_FIELDS
from sessionroute.router.state.sessions import DEFAULT_MAX_BYTES, DEFAULT_TTL_S

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_SESSION_HEADERS",
    "VLLM_ROUTER_MAX_CONCURRENT",
    "VLLM_ROUTER_QUEUE_SIZE",
    "VLLM_ROUTER_SESSION_HEADERS",
    "RouterConfig",
    "header_names",
]

DEFAULT_SESSION_HEADERS: tuple[str, ...] = ("x-session-id", *AGENT_SESSION_HEADERS)
"""Ours: only explicit, session-scoped headers identify a session: ``x-session-id``, then the
agent harnesses' (:data:`~sessionroute.router.session_keys.AGENT_SESSION_HEADERS`)."""

VLLM_ROUTER_SESSION_HEADERS: tuple[str, ...] = (
    "x-session-id",
    "x-user-id",
    "x-tenant-id",
    "x-correlation-id",
    "x-request-id",
    "x-trace-id",
)
"""vllm-router 0.1.17's list, checked in order (``shared/ROUTER.md``)."""


VLLM_ROUTER_QUEUE_SIZE = 100
"""vllm-router 0.1.17's ``--queue-size`` default: requests that may wait for a token of its
rate limit (:attr:`RouterConfig.admission_max_waiting` when the rate limit is on)."""

VLLM_ROUTER_MAX_CONCURRENT = 32768
"""vllm-router 0.1.17's ``--max-concurrent-requests`` default: the rate limit's capacity
(:attr:`RouterConfig.rate_limit_capacity`) when only its refill rate is given."""

CONNECT_TIMEOUT_S = 10.0
"""Longest wait for a connection to a worker to open, in seconds
(:attr:`RouterConfig.connect_timeout_s`)."""


class RouterConfig(BaseModel):
    """Settings of the router core (seconds, tokens and counts as named).

    Attributes:
        session_headers: headers checked for the session id, in order (lower-cased).
        session_body_fields: dotted JSON body fields read for the session id, in order, when
            no session header is present (:mod:`sessionroute.router.session_keys`; empty:
            headers only).
        session_ttl_s: idle seconds before a pinned session expires; given to every policy
            whose ``Config`` has ``session_ttl_s`` unless the policy's options set it.
        sweep_interval_s: seconds between the router's sweeps of expired sessions (None: only
            the policies' own sweeps inside routing calls).
        retry_max_attempts: upstream attempts per request, the first included (vllm-router's
            ``--retry-max-retries``, which counts attempts); 1 disables retries.
        retry_backoff_s: wait before the first retry.
        retry_backoff_multiplier: growth of the wait per retry.
        retry_max_backoff_s: cap of the wait.
        retry_jitter_factor: the wait is multiplied by ``1 + jitter * U(-1, 1)``.
        circuit_breaker: whether failing workers' circuits open (``--disable-circuit-breaker``).
        cb_failure_threshold: consecutive request failures that open a worker's circuit.
        cb_success_threshold: successes in the half-open state that close it again.
        cb_timeout_s: seconds an open circuit stays open before it turns half-open.
        cb_keep_half_available: open a circuit only while at least half of the workers
            (rounded up) stay available (sessionroute's rule; off: vllm-router's breaker,
            which opens at the threshold even for the last worker).
        cb_half_open_on_recovery: a worker whose health checks turn it healthy again after
            it was unhealthy gets its open circuit half-open at once (sessionroute's rule, as
            Envoy un-ejects a host that passes an active health check); off: vllm-router's
            breaker, which stays open until ``cb_timeout_s`` whatever the checks say.
        scrape_interval_s: seconds between scrapes of every worker's ``/metrics`` for its engine
            gauges (``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
            ``vllm:kv_cache_usage_perc``) that policies read through the cluster view; None:
            never (gauges stay unknown).
        content_block_tokens: tokens per content block of :attr:`RouteRequest.blocks`
            (prefix keys that content-aware policies read; vLLM's default KV block is 16).
        admission_max_waiting: requests that may wait in the router's admission queue when
            the policy holds them back (0: none wait, a held-back request is refused).
        admission_max_wait_s: longest wait in the admission queue before the request is
            refused.
        rate_limit_capacity: vllm-router's rate limit (``--max-concurrent-requests``): a
            token bucket of this capacity in front of placement
            (:mod:`sessionroute.router.ratelimit`); None: no limit.
        rate_limit_per_s: its refill rate in tokens per second
            (``--rate-limit-tokens-per-second``; None: the capacity per second).
        max_session_id_bytes: longest session id accepted (a longer one is a 400 before
            placement; :mod:`sessionroute.router.validate`).
        session_table_max_bytes: capacity of the session table in estimated bytes (session
            id length + :data:`~sessionroute.router.state.sessions.ENTRY_OVERHEAD_BYTES` per
            entry); past it the least recently used session is evicted, as past the entry cap
            (``max_sessions``, a policy option); given to every policy whose ``Config`` has
            ``session_table_max_bytes`` unless the policy's options set it.
        retry_after_send: also retry a request whose connection broke after it was fully
            written to the worker, before any byte of the answer reached the client (as
            vllm-router does: its failed send is a 500, which it retries). On by default: a
            worker that crashed mid-request took the generation with it, and the client gets
            its answer from another worker instead of a 502. Off, only requests that provably
            did not reach the worker are retried (a connection reset on a worker that lives on
            could otherwise run a generation twice).
        health_check_interval_s: seconds between health-check rounds of every worker.
        health_recheck_interval_s: seconds between extra checks of the unhealthy workers
            only, between rounds (capped by ``health_check_interval_s``).
        health_check_timeout_s: seconds a check may take before it counts as failed; also
            how long a stream from a worker that turned unhealthy may stay silent before it is
            ended.
        health_failure_threshold: consecutive failed checks that make a worker unhealthy.
        health_success_threshold: consecutive passed checks that make it healthy again.
        request_timeout_s: seconds a worker has to answer a request in full, from the moment
            the attempt starts; past it the attempt fails as a timeout (a 504, never retried:
            :meth:`~sessionroute.router.RoutingCore.attempt_failed`,
            :meth:`~sessionroute.router.RoutingCore.answer_broke`).
        first_byte_timeout_s: seconds a worker has to send the response head of a streamed
            request before it is given up as hung and the request placed again
            (:meth:`~sessionroute.router.RoutingCore.first_byte_timeout_s`); 0: no such limit.
        worker_startup_timeout_s: how long a wait for workers to pass their first health
            check may last, at start-up and for a worker added at run time
            (:class:`~sessionroute.router.startup.StartupWait`; vllm-router's 600 s).
        worker_startup_check_interval_s: seconds between the checks of that wait
            (vllm-router's 30 s).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_headers: tuple[str, ...] = Field(default=DEFAULT_SESSION_HEADERS, min_length=1)
    session_body_fields: tuple[str, ...] = DEFAULT_SESSION_BODY_FIELDS
    session_ttl_s: float = Field(default=DEFAULT_TTL_S, gt=0)
    sweep_interval_s: float | None = Field(default=60.0, gt=0)
    retry_max_attempts: int = Field(default=5, ge=1)
    retry_backoff_s: float = Field(default=0.05, ge=0)
    retry_backoff_multiplier: float = Field(default=1.5, ge=1)
    retry_max_backoff_s: float = Field(default=30.0, ge=0)
    retry_jitter_factor: float = Field(default=0.2, ge=0, le=1)
    circuit_breaker: bool = True
    cb_failure_threshold: int = Field(default=10, ge=1)
    cb_success_threshold: int = Field(default=3, ge=1)
    cb_timeout_s: float = Field(default=60.0, gt=0)
    cb_keep_half_available: bool = False
    cb_half_open_on_recovery: bool = False
    scrape_interval_s: float | None = Field(default=1.0, gt=0)
    content_block_tokens: int = Field(default=16, ge=1)
    admission_max_waiting: int = Field(default=1024, ge=0)
    admission_max_wait_s: float = Field(default=60.0, ge=0)
    rate_limit_capacity: int | None = Field(default=None, ge=1)
    rate_limit_per_s: float | None = Field(default=None, gt=0)
    max_session_id_bytes: int = Field(default=256, ge=1)
    session_table_max_bytes: int = Field(default=DEFAULT_MAX_BYTES, ge=1)
    retry_after_send: bool = True
    health_check_interval_s: float = Field(default=60.0, gt=0)
    health_recheck_interval_s: float = Field(default=5.0, gt=0)
    health_check_timeout_s: float = Field(default=5.0, gt=0)
    health_failure_threshold: int = Field(default=3, ge=1)
    health_success_threshold: int = Field(default=2, ge=1)
    request_timeout_s: float = Field(default=1800.0, gt=0)
    first_byte_timeout_s: float = Field(default=0.0, ge=0)
    worker_startup_timeout_s: float = Field(default=600.0, ge=0)
    worker_startup_check_interval_s: float = Field(default=30.0, gt=0)

    @property
    def connect_timeout_s(self) -> float:
        """Seconds a connection to a worker may take to open: :data:`CONNECT_TIMEOUT_S`, or
        the request timeout when that is shorter."""
        return min(self.request_timeout_s, CONNECT_TIMEOUT_S)

    @property
    def scrape_timeout_s(self) -> float:
        """Seconds one scrape of a worker's engine gauges may take: the health-check timeout,
        or the scrape interval when that is shorter (a scrape never overlaps the next)."""
        interval = self.scrape_interval_s
        timeout = self.health_check_timeout_s
        return timeout if interval is None else min(interval, timeout)

    @field_validator("session_headers")
    @classmethod
    def _check_headers(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        return header_names(names)


def header_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """HTTP header names stripped and lower-cased.

    Raises:
        ValueError: naming the list when a name is empty or has white space or a colon.
    """
    out = tuple(n.strip().lower() for n in names)
    if any(not n or any(c.isspace() or c == ":" for c in n) for n in out):
        raise ValueError(f"invalid header name in {list(names)}")
    return out
