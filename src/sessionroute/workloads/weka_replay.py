"""``trace:weka``: replay of the Weka Claude Code sessions (``shared/WORKLOADS.md`` section 2).

Sessions carry no start time, so they start at a fixed concurrency (closed loop: a new session
starts when one ends) or as a Poisson process. Inside a session each thread (``agent`` 0 is the
main conversation, k > 0 the k-th subagent) is a chain: its next call is sent ``think_time``
after the previous call's response arrived (when ``think_time`` is empty, the recorded gap
``t - (t_prev + api_time_prev)`` is used, else 0). A subagent thread starts after the latest
main-thread call that had finished before the subagent's first call in the recording, with the
recorded delay. Outputs are forced to the recorded length (at least 1 token).

Content: the prefix tree is rebuilt from ``cached_tokens``/``match_row`` (``blocks(r) =
blocks(match_row)[:cached_tokens / 64] + fresh blocks``), re-keyed at the replica block size
(:func:`sessionroute.workloads.content.expand_trace_blocks` semantics: a block's key is
determined by the 64-token trace block holding its last token). Keys cover prompts only: the
trace hashes inputs, so a call's output is not re-hit by the next call.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sessionroute.workloads.base import Host, Turn, TurnOutcome
from sessionroute.workloads.traces import WEKA_REQUESTS, resolve_trace
from sessionroute.workloads.weka import WekaKeys, WekaRow, WekaTrace, load_weka

__all__ = ["WekaReplay", "WekaReplayConfig"]


class WekaReplayConfig(BaseModel):
    """Options of ``trace:weka`` (seconds, tokens).

    Attributes:
        kind: always ``"trace:weka"``.
        path: the CSV (a path, or a file name looked up in the trace directory).
        arrival: ``"closed"`` (``concurrency`` sessions at a time) or ``"poisson"``.
        concurrency: sessions in progress at once (closed loop).
        sessions_per_s: session arrival rate (Poisson).
        session_key: ``"session"`` (one router session per trace session) or ``"thread"``
            (one per (session, agent) thread).
        max_sessions: replay only this many sessions (after ordering); None for all.
        order: ``"shuffle"`` (seeded) or ``"trace"`` (file order).
        think_time_scale: multiplies every think time and subagent delay.
        max_think_s: caps every think time and subagent delay (None: as recorded).
        shared_prefix_tokens: leading tokens treated as shared by every session (the trace's
            ids are per session; its README estimates ~15k shared system + tools tokens).
        too_long: a session with a call longer than the replicas' ``max_model_len`` is
            skipped (``"skip_session"``, counted) or sent and rejected (``"reject"``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["trace:weka"] = "trace:weka"
    path: str = WEKA_REQUESTS
    arrival: Literal["closed", "poisson"] = "closed"
    concurrency: int = Field(default=16, ge=1)
    sessions_per_s: float = Field(default=0.01, gt=0)
    session_key: Literal["session", "thread"] = "session"
    max_sessions: int | None = Field(default=None, ge=1)
    order: Literal["shuffle", "trace"] = "shuffle"
    think_time_scale: float = Field(default=1.0, ge=0)
    max_think_s: float | None = Field(default=None, ge=0)
    shared_prefix_tokens: int = Field(default=0, ge=0)
    too_long: Literal["skip_session", "reject"] = "skip_session"

    def build(self, rng: Any) -> WekaReplay:
        """Load the trace (validating it) and return a fresh replay.

        Raises:
            ConfigError: if the file is not found. TraceFormatError: if it is malformed.
        """
        return WekaReplay(self, load_weka(resolve_trace(self.path)), rng)


class _Session:
    __slots__ = ("done_threads", "index", "rows", "sid", "threads")

    def __init__(self, index: int, rows: list[int], sid: str) -> None:
        self.index = index
        self.rows = rows
        self.sid = sid
        self.threads: dict[int, list[int]] = {}
        self.done_threads = 0


class WekaReplay:
    """The running replay; see the module docstring."""

    def __init__(
        self, config: WekaReplayConfig, trace: WekaTrace, rng: np.random.Generator
    ) -> None:
        self.config = config
        self.trace = trace
        self.rng = rng
        order = sorted(trace.sessions)
        if config.order == "shuffle":
            order = [order[i] for i in rng.permutation(len(order)).tolist()]
        if config.max_sessions is not None:
            order = order[: config.max_sessions]
        self._order = order
        self._host: Host | None = None
        self._next = 0
        self._ended = 0
        self._total = len(order)
        self._keys: WekaKeys | None = None
        self._anchors: dict[int, list[tuple[_Session, int, float]]] = {}
        self.stats = {
            "sessions_total": len(order),
            "sessions_started": 0,
            "sessions_skipped_too_long": 0,
            "threads": 0,
            "requests_sent": 0,
            "outputs_raised_to_1": 0,
        }

    # -- Workload protocol ----------------------------------------------------------------------
    def start(self, host: Host) -> None:
        """Start sessions (closed loop: ``concurrency`` now; Poisson: on a seeded schedule)."""
        self._host = host
        c = self.config
        self._keys = WekaKeys(self.trace, host.block_size, c.shared_prefix_tokens)
        if c.arrival == "closed":
            for _ in range(min(c.concurrency, self._total)):
                self._start_next()
        else:
            gaps = self.rng.exponential(1.0 / c.sessions_per_s, self._total).tolist()
            t = host.now()
            for gap in gaps:
                t += gap
                host.call_at(t, self._start_next)
        if self._total == 0:
            host.stop()

    def progress(self) -> float:
        """Sessions ended over sessions to replay."""
        return self._ended / self._total if self._total else 1.0

    def summary(self) -> dict[str, Any]:
        """Replay counters."""
        return dict(self.stats)

    # -- sessions -------------------------------------------------------------------------------
    def _host_or_raise(self) -> Host:
        if self._host is None:
            raise RuntimeError("workload not started")
        return self._host

    def _start_next(self) -> None:
        host = self._host_or_raise()
        while self._next < len(self._order):
            sess_id = self._order[self._next]
            self._next += 1
            rows = self.trace.sessions[sess_id]
            longest = max(
                self.trace.rows[i].input_tokens + max(1, self.trace.rows[i].output_tokens)
                for i in rows
            )
            if self.config.too_long == "skip_session" and longest > host.max_model_len:
                self.stats["sessions_skipped_too_long"] += 1
                self._ended += 1
                if self._ended >= self._total:
                    host.stop()
                continue
            self._open(_Session(sess_id, rows, f"weka-{sess_id}"))
            return

    def _session_over(self) -> None:
        host = self._host_or_raise()
        self._ended += 1
        if self._ended >= self._total:
            host.stop()
        elif self.config.arrival == "closed":
            host.call_at(host.now(), self._start_next)

    def _open(self, s: _Session) -> None:
        host = self._host_or_raise()
        rows = self.trace.rows
        self.stats["sessions_started"] += 1
        for i in s.rows:
            s.threads.setdefault(rows[i].agent, []).append(i)
        for lst in s.threads.values():
            lst.sort(key=lambda i: (rows[i].turn, rows[i].t))
        self.stats["threads"] += len(s.threads)
        main = s.threads.get(0, [])
        now = host.now()
        for agent, lst in sorted(s.threads.items()):
            if agent == 0:
                host.call_at(now, partial(self._send, s, agent, 0))
                continue
            first = rows[lst[0]]
            anchor: WekaRow | None = None
            for i in main:
                r = rows[i]
                if r.t + (r.api_time or 0.0) <= first.t:
                    anchor = r
            if anchor is None:
                host.call_at(now + self._pace(first.t), partial(self._send, s, agent, 0))
            else:
                delay = first.t - (anchor.t + (anchor.api_time or 0.0))
                self._anchors.setdefault(anchor.row, []).append((s, agent, delay))

    def _pace(self, seconds: float) -> float:
        c = self.config
        v = max(0.0, seconds) * c.think_time_scale
        return min(v, c.max_think_s) if c.max_think_s is not None else v

    def _send(self, s: _Session, agent: int, k: int) -> None:
        host = self._host_or_raise()
        r = self.trace.rows[s.threads[agent][k]]
        out = r.output_tokens
        if out < 1:
            out = 1
            self.stats["outputs_raised_to_1"] += 1
        sid = s.sid if self.config.session_key == "session" else f"{s.sid}-{agent}"
        if self._keys is None:
            raise RuntimeError("workload not started")
        keys = self._keys.keys(r.row)
        self.stats["requests_sent"] += 1
        turn = Turn(sid, r.input_tokens, out, keys, tag=(s, agent, k))
        host.submit(turn, self._on_done)

    def _on_done(self, outcome: TurnOutcome) -> None:
        host = self._host_or_raise()
        s, agent, k = outcome.turn.tag
        rows = self.trace.rows
        lst = s.threads[agent]
        row = rows[lst[k]]
        now = host.now()
        for sub_s, sub_agent, delay in self._anchors.pop(row.row, []):
            host.call_at(now + self._pace(delay), partial(self._send, sub_s, sub_agent, 0))
        if k + 1 < len(lst):
            nxt = rows[lst[k + 1]]
            if nxt.think_time is not None:
                think = nxt.think_time
            elif row.api_time is not None:
                think = nxt.t - (row.t + row.api_time)
            else:
                think = 0.0
            host.call_at(now + self._pace(think), partial(self._send, s, agent, k + 1))
            return
        if self.config.session_key == "thread":
            host.end_session(outcome.turn.session_id, "completed")
        s.done_threads += 1
        if s.done_threads == len(s.threads):
            if self.config.session_key == "session":
                host.end_session(s.sid, "completed")
            self._session_over()
