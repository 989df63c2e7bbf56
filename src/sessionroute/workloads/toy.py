"""``toy``: a small multi-turn workload for tests and CI (``shared/WORKLOADS.md`` section 3).

About 48 sessions of about 10 turns start as a Poisson process. Every session opens with a
shared system prompt and a private first message; each turn generates a forced output, waits
a think time, and appends a private follow-up message. Meant for 3 x ``toy-8b-h100-tp1`` with a
64k-token KV cache (:data:`TOY_REPLICAS`): enough resident context to force eviction and
preemption, small enough to run in seconds.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sessionroute.workloads.base import Host, Turn, TurnOutcome
from sessionroute.workloads.content import BlockChain, reply_in_history, reused_reply_tokens
from sessionroute.workloads.distributions import LogNormal

__all__ = ["TOY_REPLICAS", "ToyConfig", "ToyWorkload"]

TOY_REPLICAS: dict[str, Any] = {
    "count": 3,
    "profile": "toy-8b-h100-tp1",
    "kv_capacity_tokens": 65536,
}
"""Default replica settings of the ``toy`` workload."""


class ToyConfig(BaseModel):
    """Options of ``toy`` (tokens and seconds).

    Attributes:
        kind: always ``"toy"``.
        sessions: number of sessions.
        arrival_rate_per_s: Poisson rate of session starts.
        turns_p50, turns_p90, turns_max: turns per session (lognormal, at least 1).
        system_prompt_tokens: prompt prefix shared by every session.
        first_p50, first_p90: private first message.
        output_p50, output_p90, output_cap: forced output per turn.
        followup_p50, followup_p90: message appended before each later turn.
        think_p50_s, think_p90_s: client delay between a response and the next turn.
        reply_reuse: fraction of each reply that the next prompt repeats token for token
            (1.0: all of it; 0 for a chat template that drops the reply's reasoning from the
            history). The rest is re-sent as as many other tokens, which miss every cache
            (:func:`~sessionroute.workloads.content.reply_in_history`). Simulation only: a
            live run sends the reply as the server returned it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["toy"] = "toy"
    sessions: int = Field(default=48, ge=1)
    arrival_rate_per_s: float = Field(default=2.0, gt=0)
    turns_p50: float = Field(default=10, gt=0)
    turns_p90: float = Field(default=16, gt=0)
    turns_max: int = Field(default=30, ge=1)
    system_prompt_tokens: int = Field(default=1024, ge=0)
    first_p50: float = Field(default=600, gt=0)
    first_p90: float = Field(default=2000, gt=0)
    output_p50: float = Field(default=150, gt=0)
    output_p90: float = Field(default=500, gt=0)
    output_cap: int = Field(default=2048, ge=1)
    followup_p50: float = Field(default=300, gt=0)
    followup_p90: float = Field(default=1200, gt=0)
    think_p50_s: float = Field(default=1.0, gt=0)
    think_p90_s: float = Field(default=5.0, gt=0)
    reply_reuse: float = Field(default=1.0, ge=0, le=1)

    def build(self, rng: Any) -> ToyWorkload:
        """A fresh :class:`ToyWorkload` using ``rng``."""
        return ToyWorkload(self, rng)


class _Session:
    __slots__ = (
        "before_reply",
        "chain",
        "follow",
        "n",
        "out_len",
        "outputs",
        "prompt_len",
        "reply_seg",
        "sid",
        "think",
        "turn",
    )

    def __init__(self, sid: str, chain: BlockChain, n: int) -> None:
        self.sid = sid
        self.chain = chain
        self.prompt_len = chain.tokens
        self.n = n
        self.turn = 0
        self.out_len = 0
        self.outputs: list[int] = []
        self.follow: list[int] = []
        self.think: list[float] = []
        self.before_reply: BlockChain | None = None  # the prompt's chain (reply_reuse < 1)
        self.reply_seg = 0


class ToyWorkload:
    """The running ``toy`` workload; see the module docstring."""

    def __init__(self, config: ToyConfig, rng: np.random.Generator) -> None:
        c = config
        self.config = c
        self.rng = rng
        self._turns = LogNormal(c.turns_p50, c.turns_p90, c.turns_max, 1)
        self._first = LogNormal(c.first_p50, c.first_p90, 8 * c.first_p90, 1)
        self._out = LogNormal(c.output_p50, c.output_p90, c.output_cap, 1)
        self._follow = LogNormal(c.followup_p50, c.followup_p90, 8 * c.followup_p90, 1)
        self._think = LogNormal(c.think_p50_s, c.think_p90_s, 20 * c.think_p90_s, 0.0)
        self._host: Host | None = None
        self._system: BlockChain | None = None
        self._seg = 0
        self._ended = 0
        self._limit = 0
        self.stats = {"sessions_started": 0, "turns": 0, "sessions_context_limit": 0}

    def _new_segment(self) -> int:
        self._seg += 1
        return self._seg

    def start(self, host: Host) -> None:
        """Schedule every session start (Poisson arrivals from ``host.now()``)."""
        c = self.config
        self._host = host
        self._limit = host.max_model_len
        self._system = BlockChain(host.block_size)
        self._system.append(self._new_segment(), c.system_prompt_tokens)
        rng = self.rng
        gaps = rng.exponential(1.0 / c.arrival_rate_per_s, c.sessions)
        t = host.now()
        for i, gap in enumerate(gaps.tolist()):
            # every draw happens here, in session order, so each policy sees the same sessions
            chain = self._system.copy()
            chain.append(self._new_segment(), self._first.sample_int(rng, 1)[0])
            n = self._turns.sample_int(rng, 1)[0]
            s = _Session(f"toy-{i}", chain, n)
            s.outputs = self._out.sample_int(rng, n)
            s.follow = self._follow.sample_int(rng, n)
            s.think = self._think.sample_list(rng, n)
            t += gap
            host.call_at(t, partial(self._open, s))

    def progress(self) -> float:
        """Sessions ended over sessions."""
        return self._ended / self.config.sessions

    def summary(self) -> dict[str, Any]:
        """Session and turn counters."""
        return dict(self.stats)

    def _open(self, s: _Session) -> None:
        self.stats["sessions_started"] += 1
        self._send(s)

    def _send(self, s: _Session) -> None:
        host = self._host
        if host is None:
            raise RuntimeError("workload not started")
        room = self._limit - s.prompt_len
        if room < 1:
            self.stats["sessions_context_limit"] += 1
            self._finish(s)
            return
        out = min(s.outputs[s.turn], room)
        if self.config.reply_reuse < 1.0:
            s.before_reply = s.chain.copy()
        s.reply_seg = self._new_segment()
        s.chain.append(s.reply_seg, out)
        s.out_len = out
        self.stats["turns"] += 1
        host.submit(Turn(s.sid, s.prompt_len, out, tuple(s.chain.keys), tag=s), self._on_done)

    def _on_done(self, outcome: TurnOutcome) -> None:
        s: _Session = outcome.turn.tag
        host = self._host
        if host is None:
            return
        s.turn += 1
        if s.turn >= s.n or not outcome.ok:
            self._finish(s)
            return
        follow = s.follow[s.turn]
        if s.before_reply is not None:  # the history re-sends only part of the reply
            reused = reused_reply_tokens(self.config.reply_reuse, s.out_len)
            s.chain = reply_in_history(
                s.before_reply, s.reply_seg, s.out_len, reused, self._new_segment()
            )
            s.before_reply = None
        s.chain.append(self._new_segment(), follow)
        s.prompt_len += s.out_len + follow
        host.call_at(host.now() + s.think[s.turn], partial(self._send, s))

    def _finish(self, s: _Session) -> None:
        host = self._host
        if host is None:
            return
        host.end_session(s.sid, "completed")
        self._ended += 1
        if self._ended >= self.config.sessions:
            host.stop()
