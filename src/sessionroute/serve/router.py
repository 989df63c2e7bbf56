"""The state of one live router: routing core, worker health, upstream connections, metrics.

A :class:`Router` owns everything one ``sessionroute serve`` process shares across requests.
All routing state is mutated on the event loop thread only, in synchronous calls, so
select-and-reserve is atomic without locks.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from sessionroute.clock import Clock, MonotonicClock
from sessionroute.errors import ConfigError
from sessionroute.router.actions import WorkerLost
from sessionroute.router.build import build_router, policy_choice
from sessionroute.router.kv.index import KvIndex
from sessionroute.router.policies.capabilities import ReadsKvEvents
from sessionroute.router.state import Cluster
from sessionroute.router.state.shared import SharedCluster, share_table
from sessionroute.router.validate import worker_url_problem
from sessionroute.serve.config import RouterSettings
from sessionroute.serve.coretimers import CoreTimers
from sessionroute.serve.gauges import GaugeScraper
from sessionroute.serve.health import HealthChecker, probe
from sessionroute.serve.kvevents import KvEventsCollector, KvEventSubscriber
from sessionroute.serve.metrics import RouterMetrics
from sessionroute.serve.probes import not_started, wait_for_workers
from sessionroute.serve.receipts import Receipts
from sessionroute.serve.request_ids import RequestIds
from sessionroute.serve.tasks import cancel_and_wait
from sessionroute.serve.upstream import REQUEST_DROP, UpstreamPool
from sessionroute.serve.usage import UsageCollector, UsageMetrics

if TYPE_CHECKING:
    from sessionroute.serve.state import RedisState

__all__ = ["WORKER_KEEPALIVE_S", "Router"]

log = logging.getLogger("sessionroute.serve")

WORKER_KEEPALIVE_S = 4.0
"""Seconds an idle connection to a worker is reused: below vLLM's API server keep-alive
(``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s by default; uvicorn's default is 5 s too), so the router
does not send a request on a connection the worker is closing at that moment."""


class Router:
    """One router instance.

    Args:
        settings: validated settings.
        clock: time source for policies, TTLs and breakers (:class:`MonotonicClock` when
            omitted; tests inject a :class:`~sessionroute.clock.ManualClock`).
        rng: random generator for jitter, generated ids and policies (seeded from the OS when
            omitted).

    Raises:
        UnknownPolicyError: unknown ``settings.policy``. ConfigError: invalid policy options.
    """

    def __init__(
        self,
        settings: RouterSettings,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.rng = rng if rng is not None else random.Random()
        config = settings.router_config()
        choice = policy_choice(config, settings.policy_name(), settings.policy_options())
        policy_rng = random.Random(self.rng.getrandbits(64))
        shared = settings.state_url is not None
        kv_content = None
        if settings.kv_tokenizer is not None:
            from sessionroute.router.kv.content import load_kv_content

            kv_content = load_kv_content(
                settings.kv_tokenizer,
                settings.kv_block_size,
                settings.kv_hash_algo,
                settings.kv_hash_seed,
            )
        self.core = build_router(
            config,
            self.clock,
            random.Random(self.rng.getrandbits(64)),
            choice=choice,
            workers=settings.worker_urls,
            policy_rng=policy_rng,
            cluster=SharedCluster if shared else Cluster,
            kv_content=kv_content,
        )
        policy = self.core.policy
        self.kv_index: KvIndex | None = policy.index if isinstance(policy, ReadsKvEvents) else None
        """The policy's KV index fed by ``--kv-events`` (None for policies without one)."""
        if settings.kv_events and self.kv_index is None:
            raise ConfigError(
                f"--kv-events given, but policy {settings.policy_name()!r} does not read KV events "
                "(use kv_aware)"
            )
        self.kv_subscribers: list[KvEventSubscriber] = []
        self.workers = self.core.health
        """url -> health record of every worker (the core's)."""
        self.core.start_unchecked()  # a worker is available once a check of it passed
        self.core.on_circuit = _log_circuit
        self.core.on_unreachable = _log_unreachable
        self.fatal_error: str | None = None
        """Why the router must stop (no worker passed a check within
        ``--worker-startup-timeout-secs``; :mod:`sessionroute.serve.probes`), or None."""
        self.on_fatal: Callable[[], None] | None = None
        """Called once :attr:`fatal_error` is set (``serve`` then shuts down, exit status 1)."""
        self.metrics = RouterMetrics(self.core, lambda: self.workers)
        self.state: RedisState | None = None
        """The link to the shared state (``--state-url``), or None for in-process state."""
        if settings.state_url is not None:
            from sessionroute.serve.metrics import SharedStateCollector
            from sessionroute.serve.state import RedisState

            self.state = RedisState(
                settings.state_url,
                self.core,
                share_table(policy),
                self.clock,
                prefix=settings.state_key_prefix,
                lease_s=settings.state_lease_secs,
                timeout_s=settings.state_timeout_secs,
            )
            self.metrics.registry.register(SharedStateCollector(self.state))
        if self.kv_index is not None:
            self.metrics.registry.register(KvEventsCollector(self.kv_index, self.kv_subscribers))
        self.usage: UsageMetrics | None = UsageMetrics() if settings.usage_metrics else None
        """Prompt and cached tokens per worker from the answers' usage (``--usage-metrics``)."""
        self.metrics.registry.register(UsageCollector(self.usage, self._prefix_cache))
        self.worker_headers: dict[str, str] = (
            {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        )
        self.worker_auth = (
            f"Authorization: Bearer {settings.api_key}\r\n".encode() if settings.api_key else b""
        )
        """The worker credential as a request header line (b"" without ``--api-key``)."""
        self.request_drop: frozenset[bytes] = (
            REQUEST_DROP | {b"authorization"}
            if settings.api_key or settings.router_api_key
            else REQUEST_DROP
        )
        """Lower-case request header names never forwarded (hop-by-hop, Host,
        Content-Length, Expect; Authorization when it is the router's or is replaced)."""
        self.request_id_names: tuple[bytes, ...] = tuple(
            n.lower().encode("latin-1") for n in settings.request_id_headers
        )
        """Lower-case names of the headers echoed as ``x-request-id``, in order."""
        self.receipts: Receipts | None = (
            Receipts(self.core, settings.route_receipts_log) if settings.route_receipts else None
        )
        """Route receipts (``--route-receipts``), or None."""
        self.expose_worker = settings.expose_worker_header or self.receipts is not None
        """Add :meth:`worker_header` to proxied responses (``--expose-worker-header``,
        ``--route-receipts``)."""
        self.new_request_id: Callable[[str], str] = RequestIds(self.rng).new
        """A new request id for a request to ``path`` that brought none
        (:meth:`~sessionroute.serve.request_ids.RequestIds.new`)."""
        self.upstream = UpstreamPool(
            timeout_s=settings.request_timeout_secs,
            connect_timeout_s=config.connect_timeout_s,
            keepalive_s=WORKER_KEEPALIVE_S,
        )
        self._session: aiohttp.ClientSession | None = None
        self.health: HealthChecker | None = None
        self.gauges: GaugeScraper | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.timers = CoreTimers(self.core, self.clock, self._check, self._sweep)
        """The core's timers on the event loop."""
        self._zmq: Any = None

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def session(self) -> aiohttp.ClientSession:
        """The client session for health checks and admin calls (RuntimeError before start)."""
        if self._session is None:
            raise RuntimeError("router not started")
        return self._session

    async def start(self) -> None:
        """Open the upstream pools and start the health checker and the TTL sweeper."""
        s = self.settings
        if self.state is not None:
            await self.state.start()
        self.upstream.start()
        connector = aiohttp.TCPConnector(
            limit=0, keepalive_timeout=60.0, enable_cleanup_closed=True
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(
                total=s.request_timeout_secs, sock_connect=self.core.config.connect_timeout_s
            ),
            cookie_jar=aiohttp.DummyCookieJar(),
            read_bufsize=2**18,
        )
        self.health = HealthChecker(
            self._session,
            self.workers,
            endpoint=s.health_check_endpoint,
            timeout_s=self.core.config.health_check_timeout_s,
            observe=self._observe_check,
            headers=self.worker_headers,
        )
        core = self.core
        self.timers.start()
        await self.health.check_once()  # a worker counts healthy once a check passed
        core.start(self.clock.now(), checked=True)
        if not_started(self):
            self._tasks.append(
                asyncio.create_task(wait_for_workers(self), name="sessionroute-startup")
            )
        self._start_kv_subscribers()
        interval = self.core.config.scrape_interval_s
        if interval is not None:
            self.gauges = GaugeScraper(
                self._session,
                self.core,
                interval_s=interval,
                timeout_s=self.core.config.scrape_timeout_s,
                headers=self.worker_headers,
            )
            self._tasks.append(asyncio.create_task(self.gauges.run(), name="sessionroute-gauges"))

    def _start_kv_subscribers(self) -> None:
        """Bind one ZMQ subscriber per ``--kv-events`` stream and start feeding the index.

        Raises:
            ConfigError: an endpoint cannot be bound (the message names it).
        """
        index = self.kv_index
        streams = self.settings.kv_streams()
        if index is None or not streams:
            if index is not None and self.settings.kv_tokenizer is None:
                log.warning("kv_aware without --kv-events/--kv-tokenizer routes by load alone")
            return
        import zmq
        import zmq.asyncio

        self._zmq = zmq.asyncio.Context()
        for stream in streams:
            sub = KvEventSubscriber(stream, index, self._zmq)
            try:
                sub.bind()
            except zmq.ZMQError as exc:
                raise ConfigError(
                    f"--kv-events: cannot bind {stream.endpoint!r} for {stream.worker}: {exc}"
                ) from None
            self.kv_subscribers.append(sub)
            self._tasks.append(
                asyncio.create_task(sub.run(), name=f"sessionroute-kv-{stream.worker}")
            )

    async def close(self) -> None:
        """Stop background tasks and close the upstream pools."""
        await self.timers.close()
        await cancel_and_wait(self._tasks)
        self._tasks = []
        if self._zmq is not None:
            self._zmq.term()
            self._zmq = None
        await self.upstream.close()
        if self.receipts is not None:
            self.receipts.close()
        if self.state is not None:
            await self.state.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- what the core's timers ask for -----------------------------------------------------
    async def _check(self, urls: tuple[str, ...] | None) -> None:
        if self.health is not None:
            await self.health.check_once(urls)

    async def _sweep(self, now: float) -> None:
        n = await self.sweep_in_chunks(now)
        if self.state is not None:
            n = await self.state.sweep()
        if n:
            log.info("expired %d idle session(s)", n)

    async def sweep_in_chunks(self, now: float | None = None) -> int:
        """Expire idle sessions in the router core's chunks
        (:meth:`~sessionroute.router.RoutingCore.sweep_chunks`), letting the event loop
        serve requests between chunks; returns how many expired."""
        total = 0
        for n in self.core.sweep_chunks(self.clock.now() if now is None else now):
            total += n
            await asyncio.sleep(0)
        return total

    # -- worker availability --------------------------------------------------------------
    def _observe_check(self, url: str, ok: bool) -> bool:
        """One health-check result of ``url``, folded in by the router core; True if its
        verdict changed. A worker that turns unhealthy gives up its requests in flight
        (:meth:`worker_lost`)."""
        changed, lost = self.core.observe_check(url, ok)
        if lost is not None:
            self.worker_lost(lost)
        return changed

    def worker_lost(self, lost: WorkerLost) -> int:
        """A worker stopped answering: act on each request in flight there as
        :meth:`~sessionroute.router.RoutingCore.on_worker_lost` says. Those whose answer has
        not reached the client are cancelled there (they fail as hung, and the core places
        them again: the session moves, a re-pin); those streaming to the client keep going
        while bytes arrive, and are ended (a truncated stream) if none arrive for
        ``lost.quiet_s``.

        Returns:
            How many requests were cancelled for re-placement.
        """
        replaced, watched = self.upstream.give_up(lost, self.core.on_worker_lost)
        if replaced or watched:
            log.warning(
                "worker %s lost (%s): %d request(s) re-placed, %d streaming watched",
                lost.url,
                lost.reason,
                replaced,
                watched,
            )
        return replaced

    # -- admin ----------------------------------------------------------------------------
    async def add_worker(self, url: str) -> None:
        """Add ``url`` after it answers its health check.

        Raises:
            WorkerError: duplicate url, bad url or failed health check.
        """
        from sessionroute.errors import WorkerError

        if problem := worker_url_problem(url):
            raise WorkerError(problem)
        if url in self.core.cluster:
            raise WorkerError(f"worker already present: {url!r}")
        s = self.settings
        ok, reason = await probe(
            self.session,
            url.rstrip("/") + s.health_check_endpoint,
            self.core.config.health_check_timeout_s,
            self.worker_headers,
        )
        if not ok:
            raise WorkerError(f"worker {url!r} failed its health check: {reason}")
        if url in self.core.cluster:  # added concurrently while probing
            raise WorkerError(f"worker already present: {url!r}")
        self.core.add_worker(url)

    def remove_worker(self, url: str) -> None:
        """Remove ``url``; its sessions re-place on their next turn.

        Raises:
            WorkerError: unknown url.
        """
        self.core.remove_worker(url)
        self.upstream.forget(url)

    # -- helpers --------------------------------------------------------------------------
    def _prefix_cache(self) -> dict[str, tuple[float, float]]:
        return {} if self.gauges is None else self.gauges.prefix_cache

    def worker_header(self, worker: str, raw_rid: bytes, status: int = 0) -> bytes:
        """The header lines a proxied response gets when :attr:`expose_worker` is set:
        ``x-sessionroute-worker`` (``--expose-worker-header``) and the route receipt
        (``--route-receipts``)."""
        out = (
            b"x-sessionroute-worker: " + worker.encode() + b"\r\n"
            if self.settings.expose_worker_header
            else b""
        )
        if self.receipts is not None:
            out += self.receipts.header_lines(worker, raw_rid, status)
        return out


def _log_circuit(url: str, opened: bool) -> None:
    """The core's ``on_circuit``: request failures opened ``url``'s circuit, or successes
    closed it."""
    log.warning("circuit of %s %s", url, "opened" if opened else "closed")


def _log_unreachable(url: str, reason: str) -> None:
    """The core's ``on_unreachable``: a request found ``url`` unreachable (the health checks
    log its return)."""
    log.warning("worker %s is now unavailable: %s", url, reason)
