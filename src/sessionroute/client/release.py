"""Releasing sessions at the router (``POST /finish_session``) without ever failing a rollout.

A release is a courtesy to the router: it frees the session's slot in ``sticky_least_loaded`` so
the next new session can go there. A rollout must never fail, or wait long, because of it, so
every release here is bounded (per attempt and in total), retried only where a retry can help
(5xx and transport errors), runs on its own small connection pool, logs failures at debug level
and never raises. The async releaser runs each release in its own task and awaits it through
:func:`asyncio.shield`, so cancelling the caller (a rollout timing out or being cancelled) does
not cancel the release.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType

import httpx

from sessionroute.client.ids import router_root
from sessionroute.errors import ConfigError

__all__ = [
    "ReleasePolicy",
    "SessionReleaser",
    "SyncSessionReleaser",
    "resolve_release",
]

log = logging.getLogger("sessionroute.client")


def resolve_release(release: bool | None) -> bool:
    """Whether to release sessions: ``release`` itself, and True for None ("ask").

    The router's HTTP contract has no endpoint that says whether its policy keeps sessions, and
    ``/finish_session`` is a cheap no-op 200 under policies that keep none (``shared/ROUTER.md``),
    so "unknown" resolves to releasing: a wasted request at worst, never a leaked session.
    """
    return True if release is None else bool(release)


@dataclass(frozen=True, slots=True)
class ReleasePolicy:
    """Bounds and backoff of one release.

    Defaults follow issue 7 (5 s per attempt, at most 10 s and 10 attempts in total); the backoff
    shape follows vllm-router's retry defaults (50 ms initial, x1.5, jitter 0.2), capped at 1 s
    because the whole budget is only seconds.

    Attributes:
        attempt_timeout_s: seconds one attempt may take (connect to last byte).
        total_timeout_s: seconds all attempts and backoff sleeps may take together; a release
            never delays its caller by more than this (plus scheduling noise).
        max_attempts: attempts in total, the first included (>= 1).
        initial_backoff_s: sleep after the first failed attempt, seconds.
        backoff_multiplier: growth of the sleep per further failure (>= 1).
        max_backoff_s: cap on one sleep, seconds.
        jitter: each sleep is scaled by a uniform factor in ``[1 - jitter, 1]`` (0..1).
    """

    attempt_timeout_s: float = 5.0
    total_timeout_s: float = 10.0
    max_attempts: int = 10
    initial_backoff_s: float = 0.05
    backoff_multiplier: float = 1.5
    max_backoff_s: float = 1.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        """Validate the fields.

        Raises:
            ConfigError: a field is out of range; the message names it and its value.
        """
        checks: list[tuple[str, float, bool]] = [
            ("attempt_timeout_s", self.attempt_timeout_s, self.attempt_timeout_s > 0),
            ("total_timeout_s", self.total_timeout_s, self.total_timeout_s > 0),
            ("max_attempts", self.max_attempts, self.max_attempts >= 1),
            ("initial_backoff_s", self.initial_backoff_s, self.initial_backoff_s >= 0),
            ("backoff_multiplier", self.backoff_multiplier, self.backoff_multiplier >= 1),
            ("max_backoff_s", self.max_backoff_s, self.max_backoff_s >= 0),
            ("jitter", self.jitter, 0 <= self.jitter <= 1),
        ]
        for name, value, ok in checks:
            if not ok:
                raise ConfigError(f"ReleasePolicy.{name} out of range: {value!r}")

    def backoff_s(self, failures: int, rng: random.Random) -> float:
        """The sleep after ``failures`` failed attempts (1-based), in seconds, jittered."""
        base = self.initial_backoff_s * self.backoff_multiplier ** (failures - 1)
        return min(base, self.max_backoff_s) * (1.0 - self.jitter * rng.random())


class _Attempts:
    """The retry loop of one release as a small state machine shared by both releasers.

    The caller asks :meth:`next_timeout` for the next attempt's timeout (None: stop), makes the
    request, and hands the outcome to :meth:`record`, which returns the sleep before the next
    attempt (None: stop). ``verdict`` ends as ``"ok"`` (2xx), ``"retry"`` (5xx or a transport
    error or attempt timeout, budget exhausted) or ``"fail"`` (any other status or error).
    """

    def __init__(self, policy: ReleasePolicy, rng: random.Random, deadline: float) -> None:
        self._policy = policy
        self._rng = rng
        self._deadline = deadline
        self.attempt = 0
        self.verdict = "fail"
        self.why = "no attempt made"

    def next_timeout(self, now: float) -> float | None:
        remaining = self._deadline - now
        if self.attempt >= self._policy.max_attempts:
            return None
        if remaining <= 0:
            self.why += " (total timeout)"
            return None
        self.attempt += 1
        return min(self._policy.attempt_timeout_s, remaining)

    def record(
        self, response: httpx.Response | None, error: Exception | None, now: float
    ) -> float | None:
        if response is None:
            self.why = repr(error)
            retryable = isinstance(error, httpx.TransportError | TimeoutError)
            self.verdict = "retry" if retryable else "fail"
        else:
            self.why = f"HTTP {response.status_code}"
            if response.is_success:
                self.verdict = "ok"
            else:
                self.verdict = "retry" if response.status_code >= 500 else "fail"
        if self.verdict != "retry" or self.attempt >= self._policy.max_attempts:
            return None
        return max(0.0, min(self._policy.backoff_s(self.attempt, self._rng), self._deadline - now))


class _ReleaserBase:
    """What the sync and async releasers share: the URL, headers, policy and counters."""

    def __init__(
        self,
        router_url: str,
        *,
        policy: ReleasePolicy | None,
        api_key: str | None,
        headers: Mapping[str, str] | None,
        rng: random.Random | None,
    ) -> None:
        self.url = f"{router_root(router_url)}/finish_session"
        self.policy = policy if policy is not None else ReleasePolicy()
        self._headers = dict(headers or {})
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._rng = rng if rng is not None else random.Random()
        self._closed = False
        self.succeeded = 0
        self.failed = 0
        self.attempts = 0

    def _limits(self, max_connections: int) -> httpx.Limits:
        if max_connections < 1:
            raise ConfigError(f"max_connections must be >= 1, got {max_connections!r}")
        return httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )

    def _note(self, session_id: str, run: _Attempts) -> bool:
        self.attempts += run.attempt
        if run.verdict == "ok":
            self.succeeded += 1
            log.debug("released session %r after %d attempt(s)", session_id, run.attempt)
            return True
        self.failed += 1
        log.debug(
            "could not release session %r at %s after %d attempt(s): %s",
            session_id,
            self.url,
            run.attempt,
            run.why,
        )
        return False


class SessionReleaser(_ReleaserBase):
    """Async ``finish_session`` client with its own small connection pool.

    Share one per process (or per router) among many rollouts; :class:`Rollout` makes its own
    when given none. Counters: ``succeeded``/``failed`` releases and ``attempts`` (HTTP tries).
    """

    def __init__(
        self,
        router_url: str,
        *,
        policy: ReleasePolicy | None = None,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 4,
        rng: random.Random | None = None,
    ) -> None:
        """Create the releaser (its connection pool opens on the first release).

        Args:
            router_url: the router's root (or ``.../v1``) URL.
            policy: timeouts, attempts and backoff; :class:`ReleasePolicy` defaults if None.
            api_key: sent as ``Authorization: Bearer`` (the router's ``--router-api-key``).
            headers: extra headers for every release request.
            max_connections: size of the releaser's own pool.
            rng: source of backoff jitter (seed it for reproducible sleeps).

        Raises:
            ConfigError: a bad URL or ``max_connections`` < 1.
        """
        super().__init__(router_url, policy=policy, api_key=api_key, headers=headers, rng=rng)
        self._client = httpx.AsyncClient(
            headers=self._headers, limits=self._limits(max_connections)
        )
        self._pending: set[asyncio.Task[dict[str, bool]]] = set()

    async def finish_session(self, session_id: str) -> bool:
        """Release one session; True when the router answered 2xx.

        Never raises an error (failures are logged at debug and give False). If the caller is
        cancelled meanwhile, the release goes on in the background (and :meth:`aclose` waits for
        it) while the caller's ``CancelledError`` propagates as usual.
        """
        results = await self.finish_sessions([session_id])
        return results.get(session_id, False)

    async def finish_sessions(self, session_ids: Iterable[str]) -> dict[str, bool]:
        """Release several sessions concurrently; ``{id: released}``. Same guarantees as above."""
        ids = list(dict.fromkeys(session_ids))
        if self._closed:
            log.debug("releaser for %s is closed; not releasing %r", self.url, ids)
            self.failed += len(ids)
            return dict.fromkeys(ids, False)
        task = asyncio.ensure_future(self._release_all(ids))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return await asyncio.shield(task)

    async def _release_all(self, ids: list[str]) -> dict[str, bool]:
        outcomes = await asyncio.gather(*(self._release(sid) for sid in ids))
        return dict(zip(ids, outcomes, strict=True))

    async def _release(self, session_id: str) -> bool:
        loop = asyncio.get_running_loop()
        run = _Attempts(self.policy, self._rng, loop.time() + self.policy.total_timeout_s)
        while (timeout := run.next_timeout(loop.time())) is not None:
            response: httpx.Response | None = None
            error: Exception | None = None
            try:
                async with asyncio.timeout(timeout):
                    response = await self._client.post(self.url, params={"session_id": session_id})
            except Exception as exc:  # never raise: every failure becomes a verdict
                error = exc
            sleep = run.record(response, error, loop.time())
            if sleep is None:
                break
            await asyncio.sleep(sleep)
        return self._note(session_id, run)

    async def aclose(self) -> None:
        """Wait for releases still running (each bounded by the policy), then close the pool.

        Idempotent. Later releases are skipped (logged, counted as failed).
        """
        self._closed = True
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        await self._client.aclose()

    async def __aenter__(self) -> SessionReleaser:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class SyncSessionReleaser(_ReleaserBase):
    """Blocking ``finish_session`` client with its own small connection pool (for sync code).

    Same policy as :class:`SessionReleaser`. An attempt's timeout bounds each socket operation
    (connect, each read, each write), which bounds a router that hangs; only a router that
    trickles bytes slower than the timeout could stretch one attempt further.
    """

    def __init__(
        self,
        router_url: str,
        *,
        policy: ReleasePolicy | None = None,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 2,
        rng: random.Random | None = None,
    ) -> None:
        """Create the releaser; arguments as for :class:`SessionReleaser`.

        Raises:
            ConfigError: a bad URL or ``max_connections`` < 1.
        """
        super().__init__(router_url, policy=policy, api_key=api_key, headers=headers, rng=rng)
        self._client = httpx.Client(headers=self._headers, limits=self._limits(max_connections))

    def finish_session(self, session_id: str) -> bool:
        """Release one session; True on 2xx. Never raises an error; failures log at debug."""
        return self.finish_sessions([session_id]).get(session_id, False)

    def finish_sessions(self, session_ids: Iterable[str]) -> dict[str, bool]:
        """Release several sessions one after another; ``{id: released}``.

        All of them share one ``policy.total_timeout_s`` budget, so the call never blocks longer
        than that however many ids there are (ids left when it runs out count as failed).
        """
        ids = list(dict.fromkeys(session_ids))
        if self._closed:
            log.debug("releaser for %s is closed; not releasing %r", self.url, ids)
            self.failed += len(ids)
            return dict.fromkeys(ids, False)
        deadline = time.monotonic() + self.policy.total_timeout_s
        return {sid: self._release(sid, deadline) for sid in ids}

    def _release(self, session_id: str, deadline: float) -> bool:
        run = _Attempts(self.policy, self._rng, deadline)
        while (timeout := run.next_timeout(time.monotonic())) is not None:
            response: httpx.Response | None = None
            error: Exception | None = None
            try:
                response = self._client.post(
                    self.url, params={"session_id": session_id}, timeout=timeout
                )
            except Exception as exc:  # never raise: every failure becomes a verdict
                error = exc
            sleep = run.record(response, error, time.monotonic())
            if sleep is None:
                break
            time.sleep(sleep)
        return self._note(session_id, run)

    def close(self) -> None:
        """Close the pool; idempotent. Later releases are skipped (logged, counted as failed)."""
        self._closed = True
        self._client.close()

    def __enter__(self) -> SyncSessionReleaser:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
