"""The workloads' :class:`~sessionroute.workloads.base.Host` over real HTTP, in real time.

:class:`LiveHost` runs the *same* workload objects the simulator runs (same seed, same sessions,
same turns) on an asyncio loop: ``call_at`` becomes a loop timer, ``submit`` a chat completion
through the router, ``end_session`` a ``POST /finish_session``. Each session is a
:class:`~sessionroute.client.Rollout` (its id in the session header of every turn; released
once at its end when ``router.finish_sessions``), and its prompt text is built by
:class:`~sessionroute.experiments.live.text.SessionText` (growing history, forced output
lengths with ``max_tokens`` + ``ignore_eos``, ``temperature`` 0).

Time: the host's clock runs ``time_scale`` times faster than the wall clock (emulated replicas
run at the same scale), so a workload's think times and arrivals, and every latency recorded,
are in the same seconds the simulator uses. Real servers run at scale 1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Callable
from typing import Any

import httpx

from sessionroute.client import Rollout, SessionReleaser
from sessionroute.experiments.live.text import SessionText, TemplateOverhead
from sessionroute.record import Recorder
from sessionroute.replica import key_list
from sessionroute.replica.ideal import IdealCache
from sessionroute.sim import RouterSection
from sessionroute.workloads.base import Host, SessionEnd, Turn, TurnOutcome, Workload

__all__ = ["LiveHost"]

log = logging.getLogger("sessionroute.experiments.live")

WORKER_HEADER = "x-sessionroute-worker"
"""The response header ``sessionroute serve --expose-worker-header`` names the worker in."""


class _Session:
    __slots__ = ("last_replica", "rollout", "start_s", "text")

    def __init__(self, text: SessionText, rollout: Rollout | None, start_s: float) -> None:
        self.text = text
        self.rollout = rollout
        self.start_s = start_s
        self.last_replica: int | None = None


class LiveHost(Host):
    """Drives one workload through a router (see the module docstring).

    Args:
        router_url: the router's root URL.
        model: model name for requests.
        block_size: tokens per block of the workload's keys (the replicas' block size).
        max_model_len: the replicas' context limit (tokens).
        router: the experiment's router/client settings (session header, release).
        replica_urls: the replicas' own URLs (prefix-cache resets).
        time_scale: host seconds per wall second.
        overhead: the chat template's tokens (subtracted from the content).
        stream: stream responses (TTFT, inter-token latency).
        request_timeout_s: wall seconds per turn.
        last_replica: session id -> replica index of its latest request (from the taps), or
            None when placements are not recorded.
        record_turns: keep a record of every answered turn in :attr:`turns`; its replica is the
            taps' or, when the router names the worker (``x-sessionroute-worker``, ``serve
            --expose-worker-header``), that worker's index in ``replica_urls``.

    Attributes:
        rec: what the clients saw (:class:`~sessionroute.record.Recorder`, the simulator's
            shape; ``queue_s`` and ``ideal_work_s`` stay empty: a client cannot see them).
        ideal: the ideal prefix cache every submitted turn goes through.
        errors: the first 20 failed turns, as ``"<session>: <error>"``.
        prefix_resets: prefix-cache resets the workload asked for.
        turns: with ``record_turns``, per answered turn in answer order: ``sent_s`` (host
            seconds), ``replica`` (-1: unknown), ``prompt_len``, ``output_len``,
            ``block_keys``, ``cache_salt``, ``cached_tokens`` (the server's usage),
            ``latency_s`` (sent to answered) and ``ttft_s`` (None without a streamed token).
    """

    def __init__(
        self,
        *,
        router_url: str,
        model: str,
        block_size: int,
        max_model_len: int,
        router: RouterSection,
        replica_urls: list[str],
        time_scale: float = 1.0,
        overhead: TemplateOverhead | None = None,
        stream: bool = False,
        request_timeout_s: float = 600.0,
        last_replica: dict[str, int] | None = None,
        record_turns: bool = False,
    ) -> None:
        self.router_url = router_url.rstrip("/")
        self.model = model
        self._block_size = block_size
        self._max_model_len = max_model_len
        self.router = router
        self.replica_urls = replica_urls
        self.scale = time_scale
        self.overhead = overhead if overhead is not None else TemplateOverhead()
        self.stream = stream
        self.timeout_s = request_timeout_s
        self.last_replica = last_replica
        self.header = router.session_headers[0]
        self.rec = Recorder()
        self.ideal = IdealCache(block_size)
        self.errors: list[str] = []
        self.prefix_resets = 0
        self.record_turns = record_turns
        self.turns: list[dict[str, Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._t0 = 0.0
        self._sessions: dict[str, _Session] = {}
        self._turns: dict[int, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._handle = 0
        self._done = asyncio.Event()
        self._error: BaseException | None = None
        self._stop_t: float | None = None
        self._plain: httpx.AsyncClient | None = None
        self._releaser: SessionReleaser | None = None
        # One TLS context for every per-session client: building one loads the CA bundle,
        # ~0.1 s of CPU that would stall the event loop at every new session.
        self._tls = ssl.create_default_context()

    # -- Host protocol --------------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        """Tokens per KV block of the replicas."""
        return self._block_size

    @property
    def max_model_len(self) -> int:
        """The replicas' context limit in tokens."""
        return self._max_model_len

    def now(self) -> float:
        """Seconds since the run started, on the host's (scaled) clock."""
        if self._loop is None:
            return 0.0
        return (self._loop.time() - self._t0) * self.scale

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn()`` at host time ``t`` (a loop timer)."""
        loop = self._require_loop()
        loop.call_at(self._t0 + t / self.scale, self._guard, fn)

    def submit(self, turn: Turn, on_done: Callable[[TurnOutcome], None]) -> int:
        """Send ``turn`` through the router now; ``on_done`` gets its outcome."""
        loop = self._require_loop()
        self._handle += 1
        handle = self._handle
        self.rec.requests_submitted += 1
        sess = self._sessions.get(turn.session_id)
        if sess is None:
            sess = self._open(turn.session_id)
        self.ideal.observe(
            key_list(turn.block_keys), turn.prompt_len, turn.output_len, turn.cache_salt
        )
        task = loop.create_task(self._turn(handle, turn, on_done, sess))
        self._turns[handle] = task
        return handle

    def cancel(self, handle: int) -> None:
        """Abort an in-flight turn (closing its connection aborts it upstream)."""
        task = self._turns.pop(handle, None)
        if task is not None and not task.done():
            task.cancel()
            self.rec.counts["requests_cancelled"] += 1

    def end_session(self, session_id: str, how: SessionEnd) -> None:
        """Record the end; release the session at the router (through its rollout)."""
        c = self.rec.counts
        c["sessions_completed" if how == "completed" else "sessions_cancelled"] += 1
        sess = self._sessions.pop(session_id, None)
        if sess is None:
            return
        self.rec.session_latency_s.append(self.now() - sess.start_s)
        if sess.rollout is not None:
            self._spawn(sess.rollout.aclose())

    def reset_prefix_cache(self) -> None:
        """``POST /reset_prefix_cache`` on every replica (in the background)."""
        from sessionroute.experiments.live.scrape import reset_prefix_caches

        self.prefix_resets += 1
        self._spawn(reset_prefix_caches(self._client(), self.replica_urls))

    def record_step(self, step: int, step_time_s: float) -> None:
        """Record an RL trainer step that ended now."""
        self.rec.step(step, self.now(), step_time_s)

    def record_group(self, latency_s: float) -> None:
        """Record a GRPO group's latency (host seconds)."""
        self.rec.group_latency_s.append(latency_s)

    def stop(self) -> None:
        """The workload is done."""
        if self._stop_t is None:
            self._stop_t = self.now()
        self._done.set()

    # -- running --------------------------------------------------------------------------------
    @property
    def duration_s(self) -> float:
        """Host seconds from the start to ``stop()`` (or to now)."""
        return self._stop_t if self._stop_t is not None else self.now()

    async def run(self, workload: Workload, max_duration_s: float | None = None) -> None:
        """Start ``workload`` and wait until it stops (or ``max_duration_s`` host seconds).

        Raises:
            What a workload callback raised.
        """
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._plain = httpx.AsyncClient(
            base_url=self.router_url,
            verify=self._tls,
            timeout=httpx.Timeout(self.timeout_s, connect=30.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        self._releaser = SessionReleaser(self.router_url)
        try:
            workload.start(self)
            if max_duration_s is None:
                await self._done.wait()
            else:
                try:
                    await asyncio.wait_for(self._done.wait(), max_duration_s / self.scale)
                except TimeoutError:
                    self.stop()
            for task in list(self._turns.values()):
                task.cancel()
            for sess in self._sessions.values():
                if sess.rollout is not None:
                    self._spawn(sess.rollout.aclose())
            self._sessions.clear()
            pending = [*self._turns.values(), *self._background]
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            await self._releaser.aclose()
            await self._plain.aclose()
        if self._error is not None:
            raise self._error

    # -- internals ------------------------------------------------------------------------------
    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("LiveHost.run() has not started")
        return self._loop

    def _client(self) -> httpx.AsyncClient:
        if self._plain is None:
            raise RuntimeError("LiveHost.run() has not started")
        return self._plain

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:
            if self._error is None:
                self._error = exc
            self.stop()

    def _spawn(self, coro: Any) -> None:
        task = self._require_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _open(self, sid: str) -> _Session:
        self.rec.counts["sessions_seen"] += 1
        rollout = None
        if self.router.send_session_header:
            rollout = Rollout(
                self.router_url,
                session_id=sid,
                release=self.router.finish_sessions,
                releaser=self._releaser,
                header=self.header,
                httpx_kwargs={
                    "timeout": httpx.Timeout(self.timeout_s, connect=30.0),
                    "verify": self._tls,
                },
            )
        sess = _Session(SessionText(sid, self._block_size, self.overhead), rollout, self.now())
        self._sessions[sid] = sess
        return sess

    def _body(self, turn: Turn, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": turn.output_len,
            "temperature": 0,
            "ignore_eos": True,
        }
        if turn.cache_salt is not None:
            body["cache_salt"] = turn.cache_salt
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def _turn(
        self, handle: int, turn: Turn, on_done: Callable[[TurnOutcome], None], sess: _Session
    ) -> None:
        loop = self._require_loop()
        messages = sess.text.next_messages(turn.prompt_len, turn.block_keys)
        body = self._body(turn, messages)
        client = sess.rollout.httpx if sess.rollout is not None else self._client()
        sent = self.now()
        w0 = loop.time()
        text, first, last, worker = "", None, None, None
        usage: dict[str, Any] = {}
        ok = False
        try:
            async with asyncio.timeout(self.timeout_s):
                if self.stream:
                    text, usage, first, last, worker = await self._stream(client, body)
                    ok = True
                else:
                    r = await client.post("/v1/chat/completions", json=body)
                    if r.status_code != 200:
                        raise _TurnError(f"HTTP {r.status_code}: {r.text[:300]}")
                    worker = r.headers.get(WORKER_HEADER)
                    data = r.json()
                    text = str(data["choices"][0]["message"]["content"] or "")
                    usage = data.get("usage") or {}
                    ok = True
        except (httpx.HTTPError, TimeoutError, _TurnError, KeyError, ValueError) as exc:
            self.rec.counts["requests_failed"] += 1
            if len(self.errors) < 20:
                self.errors.append(f"{turn.session_id}: {type(exc).__name__}: {exc}")
        done = self.now()
        self._turns.pop(handle, None)
        sess.text.add_reply(text, turn.output_len)
        cached = 0
        if ok:
            cached = self._account(turn, usage, done - sent, w0, first, last)
        replica = -1
        if self.last_replica is not None and ok:
            replica = self.last_replica.get(turn.session_id, -1)
            if sess.last_replica is not None and replica != sess.last_replica:
                self.rec.counts["session_moves"] += 1
            sess.last_replica = replica
        if self.record_turns and ok:
            if replica < 0 and worker in self.replica_urls:
                replica = self.replica_urls.index(worker)
            self.turns.append(
                {
                    "sent_s": sent,
                    "replica": replica,
                    "prompt_len": turn.prompt_len,
                    "output_len": turn.output_len,
                    "block_keys": list(turn.block_keys),
                    "cache_salt": turn.cache_salt,
                    "cached_tokens": cached,
                    "latency_s": done - sent,
                    "ttft_s": None if first is None else (first - w0) * self.scale,
                }
            )
        self._guard(lambda: on_done(TurnOutcome(turn, sent, done, ok, cached, replica)))

    def _account(
        self,
        turn: Turn,
        usage: dict[str, Any],
        latency: float,
        w0: float,
        first: float | None,
        last: float | None,
    ) -> int:
        rec = self.rec
        out = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or 0)
        rec.requests_completed += 1
        rec.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        rec.output_tokens += out
        rec.cached_tokens += cached
        rec.turn_latency_s.append(latency)
        if first is not None:
            rec.ttft_s.append((first - w0) * self.scale)
            if last is not None and out > 1:
                itl = (last - first) * self.scale / (out - 1)
                rec.itl_s.append(itl)
                rec.turn_itl_s.append(itl)
            else:
                rec.turn_itl_s.append(0.0)
        return cached

    async def _stream(
        self, client: httpx.AsyncClient, body: dict[str, Any]
    ) -> tuple[str, dict[str, Any], float | None, float | None, str | None]:
        loop = self._require_loop()
        parts: list[str] = []
        usage: dict[str, Any] = {}
        first = last = None
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                raise _TurnError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
            worker = r.headers.get(WORKER_HEADER)
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                event = json.loads(payload)
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        now = loop.time()
                        first = now if first is None else first
                        last = now
                        parts.append(piece)
        return "".join(parts), usage, first, last, worker


class _TurnError(Exception):
    """A turn's HTTP exchange failed (status, message)."""
