"""``trace:mooncake``: open-loop replay of a Mooncake trace (``shared/WORKLOADS.md`` section 2).

Each request is sent at its recorded timestamp times ``time_scale`` (open loop: it does not wait
for its session's previous turn). Its session id is the reconstructed session of the sessions
CSV (or one session per request without it); a session is released after its last replayed
request has finished. Content keys come from the 512-token chained ``hash_ids``, re-keyed at the
replica block size (:func:`~sessionroute.workloads.content.expand_trace_blocks`); the ids cover
prompts only, so outputs are not re-hit. Outputs are forced to the recorded length (at least 1).
"""

from __future__ import annotations

from functools import partial
from pathlib import PurePath
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sessionroute.workloads.base import Host, Turn, TurnOutcome
from sessionroute.workloads.content import expand_trace_blocks
from sessionroute.workloads.mooncake import (
    MOONCAKE_BLOCK,
    MooncakeTrace,
    load_mooncake,
    load_mooncake_sessions,
)
from sessionroute.workloads.traces import (
    MOONCAKE_CONVERSATION,
    MOONCAKE_CONVERSATION_SESSIONS,
    resolve_trace,
)

__all__ = ["MooncakeReplay", "MooncakeReplayConfig"]

_NAMESPACE = -3


class MooncakeReplayConfig(BaseModel):
    """Options of ``trace:mooncake`` (seconds, tokens).

    Attributes:
        kind: always ``"trace:mooncake"``.
        path: the JSONL trace (a path, or a file name looked up in the trace directory).
        sessions_path: the reconstructed-sessions CSV; None or ``""`` for one session per
            request. When not given it is the public trace's sessions CSV if ``path`` is the
            public trace (file name ``mooncake_conversation_trace.jsonl``), else None: the
            sessions CSV numbers the public trace's rows and fits no other file.
        time_scale: multiplies every arrival time (0.5 replays twice as fast).
        start_s: replay requests from this recorded time on (seconds).
        duration_s: replay requests recorded before ``start_s + duration_s`` (None: all).
        max_requests: replay at most this many requests (None: all).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["trace:mooncake"] = "trace:mooncake"
    path: str = MOONCAKE_CONVERSATION
    sessions_path: str | None = MOONCAKE_CONVERSATION_SESSIONS
    time_scale: float = Field(default=1.0, gt=0)
    start_s: float = Field(default=0.0, ge=0)
    duration_s: float | None = Field(default=None, gt=0)
    max_requests: int | None = Field(default=None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _sessions_of_the_trace(cls, data: Any) -> Any:
        """A trace of one's own gets no sessions CSV unless one is named."""
        own = isinstance(data, dict) and "sessions_path" not in data and "path" in data
        if own and PurePath(str(data["path"])).name.removesuffix(".gz") != MOONCAKE_CONVERSATION:
            return {**data, "sessions_path": None}
        return data

    def build(self, rng: Any) -> MooncakeReplay:
        """Load the trace (validating it) and return a fresh replay.

        Raises:
            ConfigError: if a file is not found. TraceFormatError: if one is malformed.
        """
        trace = load_mooncake(resolve_trace(self.path))
        if self.sessions_path:
            trace.sessions = load_mooncake_sessions(
                resolve_trace(self.sessions_path), len(trace.requests)
            )
        return MooncakeReplay(self, trace, rng)


class MooncakeReplay:
    """The running replay; see the module docstring."""

    def __init__(
        self, config: MooncakeReplayConfig, trace: MooncakeTrace, rng: np.random.Generator
    ) -> None:
        self.config = config
        self.trace = trace
        self.rng = rng
        lo_ms = config.start_s * 1000.0
        hi_ms = float("inf") if config.duration_s is None else lo_ms + config.duration_s * 1000.0
        rows = [i for i, r in enumerate(trace.requests) if lo_ms <= r.timestamp_ms < hi_ms]
        if config.max_requests is not None:
            rows = rows[: config.max_requests]
        self._rows = rows
        self._left: dict[str, int] = {}
        for i in rows:
            sid = self._sid(i)
            self._left[sid] = self._left.get(sid, 0) + 1
        self._host: Host | None = None
        self._done = 0
        self.stats = {
            "requests_total": len(rows),
            "sessions_total": len(self._left),
            "requests_sent": 0,
            "outputs_raised_to_1": 0,
        }

    def _sid(self, row: int) -> str:
        s = self.trace.sessions
        return f"mc-r{row}" if s is None else f"mc-{s[row]}"

    def start(self, host: Host) -> None:
        """Schedule every request at its scaled arrival time after ``host.now()``."""
        self._host = host
        t0 = host.now()
        lo_ms = self.config.start_s * 1000.0
        scale = self.config.time_scale / 1000.0
        for i in self._rows:
            t = t0 + (self.trace.requests[i].timestamp_ms - lo_ms) * scale
            host.call_at(t, partial(self._send, i))
        if not self._rows:
            host.stop()

    def progress(self) -> float:
        """Requests finished over requests to replay."""
        return self._done / len(self._rows) if self._rows else 1.0

    def summary(self) -> dict[str, Any]:
        """Replay counters."""
        return dict(self.stats)

    def _send(self, i: int) -> None:
        host = self._host
        if host is None:
            raise RuntimeError("workload not started")
        r = self.trace.requests[i]
        out = r.output_length
        if out < 1:
            out = 1
            self.stats["outputs_raised_to_1"] += 1
        keys = expand_trace_blocks(
            r.hash_ids, MOONCAKE_BLOCK, r.input_length, host.block_size, _NAMESPACE
        )
        self.stats["requests_sent"] += 1
        host.submit(Turn(self._sid(i), r.input_length, out, keys, tag=i), self._on_done)

    def _on_done(self, outcome: TurnOutcome) -> None:
        host = self._host
        if host is None:
            return
        self._done += 1
        sid = outcome.turn.session_id
        left = self._left[sid] - 1
        self._left[sid] = left
        if left == 0:
            host.end_session(sid, "completed")
        if self._done >= len(self._rows):
            host.stop()
