"""The state of one live router: routing core, worker health, upstream connections, metrics.

A :class:`Router` owns everything one ``sessionroute serve`` process shares across requests.
All routing state is mutated on the event loop thread only, in synchronous calls, so
select-and-reserve is atomic without locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from sessionroute.clock import Clock, MonotonicClock
from sessionroute.errors import ConfigError
from sessionroute.router import RoutingCore, choose_policy
from sessionroute.router.core import SWEEP_CHUNK
from sessionroute.router.kv.index import KvIndex
from sessionroute.router.retry import WorkerLostAction
from sessionroute.router.state import Cluster
from sessionroute.router.state.shared import SharedCluster, share_table
from sessionroute.serve.config import RouterSettings
from sessionroute.serve.exchange import Exchange
from sessionroute.serve.gauges import GaugeScraper
from sessionroute.serve.health import HealthChecker, probe
from sessionroute.serve.kvevents import KvEventsCollector, KvEventSubscriber
from sessionroute.serve.metrics import RouterMetrics
from sessionroute.serve.probes import not_started, wait_for_workers
from sessionroute.serve.receipts import Receipts
from sessionroute.serve.upstream import REQUEST_DROP, UpstreamPool
from sessionroute.serve.usage import UsageCollector, UsageMetrics

if TYPE_CHECKING:
    from sessionroute.serve.state import RedisState

__all__ = ["WORKER_KEEPALIVE_S", "Router"]

CIRCUIT_RECHECK_MARGIN_S = 0.005
"""Added to the time left when a circuit's timer fired before the circuit was due."""

log = logging.getLogger("sessionroute.serve")

WORKER_KEEPALIVE_S = 4.0
"""Seconds an idle connection to a worker is reused: below vLLM's API server keep-alive
(``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s by default; uvicorn's default is 5 s too), so the router
does not send a request on a connection the worker is closing at that moment."""

_ALNUM = string.ascii_letters + string.digits
_ID_TABLE = bytes(ord(_ALNUM[i % len(_ALNUM)]) for i in range(256))
"""Maps a random byte to an alphanumeric (the slight bias toward 8 letters is harmless)."""
_ID_PREFIX = {"/v1/chat/completions": "chatcmpl-", "/v1/completions": "cmpl-"}
_ID_SEQ_START = 10**11
"""The first sequence number of generated request ids (the smallest with 12 digits)."""


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
        choice = choose_policy(
            settings.policy_name(),
            settings.policy_options(),
            session_ttl_s=config.session_ttl_s,
            session_table_max_bytes=config.session_table_max_bytes,
        )
        policy = choice.build(clock=self.clock, rng=random.Random(self.rng.getrandbits(64)))
        policy.bound_sweeps(SWEEP_CHUNK)  # no routing call expires a whole table at once
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
        self.core = RoutingCore(
            policy,
            (SharedCluster if shared else Cluster)(settings.worker_urls),
            config,
            rng=random.Random(self.rng.getrandbits(64)),
            kv_content=kv_content,
        )
        self.kv_index: KvIndex | None = getattr(policy, "index", None)
        """The policy's KV index fed by ``--kv-events`` (None for policies without one)."""
        if settings.kv_events and not isinstance(self.kv_index, KvIndex):
            raise ConfigError(
                f"--kv-events given, but policy {settings.policy_name()!r} does not read KV events "
                "(use kv_aware)"
            )
        self.kv_subscribers: list[KvEventSubscriber] = []
        self.workers = self.core.health
        """url -> health record of every worker (the core's)."""
        for url, wh in self.workers.items():  # healthy only once a check passed
            wh.start_unchecked()
            self.core.refresh(url)
        self.fatal_error: str | None = None
        """Why the router must stop (no worker passed a check within
        ``--worker-startup-timeout-secs``; :mod:`sessionroute.serve.probes`), or None."""
        self.on_fatal: Callable[[], None] | None = None
        """Called once :attr:`fatal_error` is set (``serve`` then shuts down, exit status 1)."""
        self.metrics = RouterMetrics(self.core, lambda: self.workers)
        self.state: RedisState | None = None
        """The link to the shared state (``--state-url``), or None for in-process state."""
        if settings.state_url is not None:
            from sessionroute.serve.state import RedisState, StateCollector

            self.state = RedisState(
                settings.state_url,
                self.core,
                share_table(policy),
                self.clock,
                prefix=settings.state_key_prefix,
                lease_s=settings.state_lease_secs,
                timeout_s=settings.state_timeout_secs,
            )
            self.metrics.registry.register(StateCollector(self.state))
        if isinstance(self.kv_index, KvIndex):
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
        base = self.rng.randbytes(12).translate(_ID_TABLE).decode()
        self._id_heads = {path: prefix + base for path, prefix in _ID_PREFIX.items()}
        """The ids' first 21 or 17 characters (prefix and random part) by route."""
        self._id_other = "req-" + base
        self._id_seq = _ID_SEQ_START
        self.upstream = UpstreamPool(
            timeout_s=settings.request_timeout_secs,
            connect_timeout_s=min(settings.request_timeout_secs, 10.0),
            keepalive_s=WORKER_KEEPALIVE_S,
        )
        self._session: aiohttp.ClientSession | None = None
        self.health: HealthChecker | None = None
        self.gauges: GaugeScraper | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._timers: dict[str, asyncio.TimerHandle] = {}
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
                total=s.request_timeout_secs, sock_connect=min(s.request_timeout_secs, 10.0)
            ),
            cookie_jar=aiohttp.DummyCookieJar(),
            read_bufsize=2**18,
        )
        self.health = HealthChecker(
            self._session,
            self.workers,
            endpoint=s.health_check_endpoint,
            interval_s=s.health_check_interval_secs,
            recheck_s=s.health_recheck_interval_secs,
            timeout_s=s.health_check_timeout_secs,
            observe=self._observe_check,
            headers=self.worker_headers,
        )
        await self.health.check_once()  # a worker counts healthy once a check passed
        self._tasks = [
            asyncio.create_task(self.health.run(first=False), name="sessionroute-health"),
            asyncio.create_task(self._sweep_loop(), name="sessionroute-sweep"),
        ]
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
                timeout_s=min(interval, s.health_check_timeout_secs),
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
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
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

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.session_sweep_interval_secs)
            n = await self.sweep_in_chunks()
            if self.state is not None:
                n = await self.state.sweep()
            if n:
                log.info("expired %d idle session(s)", n)

    async def sweep_in_chunks(self) -> int:
        """Expire idle sessions in the router core's chunks
        (:meth:`~sessionroute.router.RoutingCore.sweep_chunks`), letting the event loop
        serve requests between chunks; returns how many expired."""
        total = 0
        for n in self.core.sweep_chunks(self.clock.now()):
            total += n
            await asyncio.sleep(0)
        return total

    # -- worker availability --------------------------------------------------------------
    def refresh(self, url: str) -> None:
        """Push a worker's availability (checks pass and circuit not open) to the cluster."""
        if self.core.refresh(url):
            available = self.core.cluster.is_healthy(url)
            log.warning("worker %s %s", url, "available" if available else "unavailable")

    def _observe_check(self, url: str, ok: bool) -> bool:
        """One health-check result of ``url``, folded in by the router core; True if its
        verdict changed. A worker that turns unhealthy gives up its requests in flight
        (:meth:`worker_lost`)."""
        s = self.settings
        changed = self.core.observe_check(
            url, ok, s.health_failure_threshold, s.health_success_threshold
        )
        if changed and not ok:
            self.worker_lost(url, f"failed {s.health_failure_threshold} health check(s)")
        return changed

    def worker_lost(self, url: str, reason: str) -> int:
        """``url`` stopped answering: act on each request in flight there as
        :meth:`~sessionroute.router.retry.RetryPolicy.on_worker_lost` says. Those whose answer
        has not reached the client are cancelled there and placed again (the session moves, a
        re-pin); those streaming to the client keep going while bytes arrive, and are ended
        (a truncated stream) if none arrive for ``--health-check-timeout-secs``.

        Returns:
            How many requests were cancelled for re-placement.
        """
        retry = self.core.retry
        replaced = 0
        watched: list[tuple[Exchange, int]] = []
        for ex in self.upstream.in_flight_on(url):
            if retry.on_worker_lost(ex.relaying) is WorkerLostAction.REPLACE:
                replaced += ex.hang(f"worker unavailable: {reason}")
            else:
                watched.append((ex, ex.chunks))
        if replaced or watched:
            log.warning(
                "worker %s lost (%s): %d request(s) re-placed, %d streaming watched",
                url,
                reason,
                replaced,
                len(watched),
            )
        if watched:
            quiet_s = self.settings.health_check_timeout_secs
            asyncio.get_running_loop().call_later(quiet_s, self._cut_stalled, watched, quiet_s)
        return replaced

    @staticmethod
    def _cut_stalled(watched: list[tuple[Exchange, int]], quiet_s: float) -> None:
        for ex, chunks in watched:
            if ex.chunks == chunks and not ex.complete:
                ex.cut(f"the worker is unavailable and sent nothing for {quiet_s:g} s")

    def record_success(self, url: str) -> None:
        """An upstream answer below 500 from ``url``."""
        if self.core.record_success(url):
            log.warning("worker %s available", url)

    def record_failure(self, url: str) -> None:
        """An upstream failure (5xx, reset, timeout) from ``url``; may open its circuit."""
        self._circuit_opened(url, self.core.record_failure(url))

    def record_unreachable(self, url: str, reason: str) -> None:
        """``url`` refused the connection: unavailable at once, so the retry re-places."""
        was_available = self.core.cluster.is_healthy(url)
        reopen_s = self.core.record_unreachable(url, reason)
        if was_available:
            log.warning("worker %s unreachable (%s); marked unhealthy", url, reason)
        self._circuit_opened(url, reopen_s)

    def _circuit_opened(self, url: str, reopen_s: float | None) -> None:
        """When a failure opened ``url``'s circuit, look at it again once it turns half-open."""
        if reopen_s is not None:
            log.warning("circuit of %s opened", url)
            self._schedule_refresh(url, reopen_s)

    def _schedule_refresh(self, url: str, delay_s: float) -> None:
        old = self._timers.pop(url, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[url] = loop.call_later(delay_s, self._circuit_due, url)

    def _circuit_due(self, url: str) -> None:
        """The timer of ``url``'s open circuit: push its availability, and if the circuit is
        still open, look again when it is due. uvloop's timers can fire up to a millisecond
        early; a single timer then left the worker out of rotation for good (found by a
        review: a healthy worker stuck out, and with it a total outage)."""
        self._timers.pop(url, None)
        self.refresh(url)
        remaining = self.core.reopens_in(url)
        if remaining is not None:
            self._schedule_refresh(url, remaining + CIRCUIT_RECHECK_MARGIN_S)

    # -- admin ----------------------------------------------------------------------------
    async def add_worker(self, url: str) -> None:
        """Add ``url`` after it answers its health check.

        Raises:
            WorkerError: duplicate url, bad url or failed health check.
        """
        from sessionroute.errors import WorkerError

        if not url.startswith(("http://", "https://")):
            raise WorkerError(f"worker url must start with http:// or https://: {url!r}")
        if url in self.core.cluster:
            raise WorkerError(f"worker already present: {url!r}")
        s = self.settings
        ok, reason = await probe(
            self.session,
            url.rstrip("/") + s.health_check_endpoint,
            s.health_check_timeout_secs,
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
        timer = self._timers.pop(url, None)
        if timer is not None:
            timer.cancel()

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

    def new_request_id(self, path: str) -> str:
        """``chatcmpl-``/``cmpl-``/``req-`` + 24 alphanumerics (vllm-router's format).

        The 24 characters are 12 random ones drawn once per router and a 12-digit sequence
        number: unique within the router without a random draw per request. The sequence
        runs over the 12-digit numbers (10**11 up to 10**12 - 1, then again), so it needs no
        zero padding.
        """
        seq = self._id_seq + 1
        self._id_seq = seq = seq if seq < 10**12 else _ID_SEQ_START
        return self._id_heads.get(path, self._id_other) + str(seq)
