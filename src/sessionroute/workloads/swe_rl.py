"""``swe-rl``: asynchronous RL with multi-turn SWE-agent rollouts (``shared/WORKLOADS.md`` 1).

The orchestrator keeps ``batch_size * (1 + async_level)`` rollouts admitted and not yet
consumed by the trainer, admitting whole GRPO groups (prime-rl / SkyRL behaviour). A rollout is
one session: turn ``k`` sends the whole conversation so far (system prompt + group task +
every earlier output and tool observation) and generates a forced number of tokens; the tool
then runs for a sampled latency and its observation is appended. A rollout ends after its
sampled number of turns or when its next prompt would pass the context limit (both
"completed"), or is cancelled by the rollout timeout or the off-policy bound. The trainer takes
``batch_size`` completed rollouts (FIFO), trains for ``trainer_step_s`` and bumps the policy
version, with the configured cache behaviour.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import Any, Final

import numpy as np

from sessionroute.errors import ConfigError
from sessionroute.workloads.base import Host, SessionEnd, Turn, TurnOutcome
from sessionroute.workloads.content import BlockChain, reply_in_history, reused_reply_tokens
from sessionroute.workloads.distributions import LogNormal, QuantileTable
from sessionroute.workloads.swe_rl_config import SweRlConfig

__all__ = ["SweRlWorkload"]

_ACTIVE: Final = 0
_DONE: Final = 1
_CANCELLED: Final = 2


class _Group:
    __slots__ = ("admit_s", "last_end_s", "open")

    def __init__(self, admit_s: float, size: int) -> None:
        self.admit_s = admit_s
        self.last_end_s = admit_s
        self.open = size


class _Rollout:
    __slots__ = (
        "before_reply",
        "chain",
        "group",
        "handle",
        "n_turns",
        "obs",
        "out_len",
        "outputs",
        "prompt_len",
        "reply_seg",
        "salt",
        "sid",
        "start_s",
        "state",
        "tools",
        "turn",
        "uid",
        "version",
    )

    def __init__(self, uid: int, group: _Group, version: int, start_s: float) -> None:
        self.uid = uid
        self.sid = f"rollout-{uid}"
        self.group = group
        self.version = version
        self.start_s = start_s
        self.state = _ACTIVE
        self.handle = -1
        self.turn = 0
        self.prompt_len = 0
        self.out_len = 0
        self.salt: str | None = None
        self.chain: BlockChain
        self.n_turns = 0
        self.outputs: list[int] = []
        self.obs: list[int] = []
        self.tools: list[float] = []
        self.before_reply: BlockChain | None = None  # the prompt's chain (reply_reuse < 1)
        self.reply_seg = 0


class SweRlWorkload:
    """The running ``swe-rl`` workload; see the module docstring.

    Args:
        config: the options.
        rng: a seeded ``numpy.random.Generator`` (all randomness of the workload).
    """

    def __init__(self, config: SweRlConfig, rng: np.random.Generator) -> None:
        c = config
        self.config = c
        self.rng = rng
        self._turns = QuantileTable(
            [
                (0.0, c.turns_min),
                (0.5, c.turns_p50),
                (0.9, c.turns_p90),
                (0.99, c.turns_p99),
                (1.0, c.turns_max),
            ]
        )
        self._task = LogNormal(c.task_tokens_p50, c.task_tokens_p90, 8 * c.task_tokens_p90, 1)
        self._out = LogNormal(c.output_p50, c.output_p90, c.output_cap, 1)
        self._obs = LogNormal(c.observation_p50, c.observation_p90, c.observation_cap, 1)
        self._tool = LogNormal(c.tool_p50_s, c.tool_p90_s, c.tool_cap_s, 0.0)
        self._host: Host | None = None
        self._limit = c.context_limit
        self._seg = 0
        self._system: BlockChain | None = None
        self._version = 0
        self._steps = 0
        self._last_step_end = 0.0
        self._trainer_busy = False
        self._open = 0  # admitted and not yet consumed by the trainer (or ended unused)
        self._active: dict[int, _Rollout] = {}
        self._buffer: deque[_Rollout] = deque()
        self._uid = 0
        self._stopped = False
        self.stats = dict.fromkeys(
            (
                "rollouts_started",
                "rollouts_completed",
                "rollouts_context_limit",
                "rollouts_timeout",
                "rollouts_off_policy",
                "rollouts_stale_discarded",
                "groups_admitted",
                "turns",
            ),
            0,
        )

    # -- Workload protocol --------------------------------------------------------------------
    def start(self, host: Host) -> None:
        """Admit the first groups at ``host.now()``."""
        self._host = host
        self._limit = min(self.config.context_limit, host.max_model_len)
        if self.config.system_prompt_tokens + 2 > self._limit:
            raise ConfigError(
                f"system_prompt_tokens {self.config.system_prompt_tokens} leaves no room under "
                f"the context limit {self._limit} (context_limit / max_model_len)"
            )
        self._system = BlockChain(host.block_size)
        self._system.append(self._new_segment(), self.config.system_prompt_tokens)
        self._last_step_end = host.now()
        self._admit()

    def progress(self) -> float:
        """Trainer steps done over steps to run."""
        return min(1.0, self._steps / self.config.steps)

    def summary(self) -> dict[str, Any]:
        """Rollout counters (started, completed, by ending) and the final policy version."""
        return {**self.stats, "policy_version": self._version}

    # -- internals ----------------------------------------------------------------------------
    def _new_segment(self) -> int:
        self._seg += 1
        return self._seg

    def _admit(self) -> None:
        c = self.config
        cap = c.inflight_rollouts or round(c.batch_size * (1 + c.async_level))
        while self._open < cap and not self._stopped:
            self._admit_group()

    def _admit_group(self) -> None:
        host, system, c, rng = self._host, self._system, self.config, self.rng
        if host is None or system is None:
            raise RuntimeError("workload not started")
        now = host.now()
        # the first prompt always fits, with room for one output token
        task_len = min(self._task.sample_int(rng, 1)[0], self._limit - 1 - system.tokens)
        base = system.copy()
        base.append(self._new_segment(), task_len)
        first_prompt = system.tokens + task_len
        group = _Group(now, c.group_size)
        self.stats["groups_admitted"] += 1
        n_turns = self._turns.sample_int(rng, c.group_size)
        for i in range(c.group_size):
            self._uid += 1
            r = _Rollout(self._uid, group, self._version, now)
            r.chain = base.copy() if i < c.group_size - 1 else base
            r.prompt_len = first_prompt
            n = n_turns[i]
            r.n_turns = n
            r.outputs = self._out.sample_int(rng, n)
            r.obs = self._obs.sample_int(rng, n)
            r.tools = self._tool.sample_list(rng, n)
            if c.cache == "salt":
                r.salt = f"v{self._version}"
            self._active[self._uid] = r
            self._open += 1
            self.stats["rollouts_started"] += 1
            host.call_at(now + c.rollout_timeout_s, partial(self._timeout, self._uid))
            self._send(r)

    def _send(self, r: _Rollout) -> None:
        host = self._host
        if host is None or r.state != _ACTIVE:
            return
        out = min(r.outputs[r.turn], self._limit - r.prompt_len)
        self._seg += 1
        chain = r.chain
        if self.config.reply_reuse < 1.0:
            r.before_reply = chain.copy()
        r.reply_seg = self._seg
        chain.append(self._seg, out)
        r.out_len = out
        # the chain's own key list, not a copy: the turn is the rollout's only request in
        # flight, and the chain only appends to it after the turn ended (Turn.block_keys)
        turn = Turn(
            session_id=r.sid,
            prompt_len=r.prompt_len,
            output_len=out,
            block_keys=chain.keys,
            cache_salt=r.salt,
            tag=r,
        )
        self.stats["turns"] += 1
        r.handle = host.submit(turn, self._on_done)

    def _on_done(self, outcome: TurnOutcome) -> None:
        r: _Rollout = outcome.turn.tag
        host = self._host
        if r.state != _ACTIVE or host is None:
            return
        r.handle = -1
        k = r.turn
        r.turn = k + 1
        total = r.prompt_len + r.out_len
        if not outcome.ok or k + 1 >= r.n_turns:
            self._end(r.uid, r, "completed", "rollouts_completed")
            return
        obs = r.obs[k]
        if total + obs + 1 > self._limit:
            self._end(r.uid, r, "completed", "rollouts_context_limit")
            return
        if r.before_reply is not None:  # the history re-sends only part of the reply
            self._seg += 1
            reused = reused_reply_tokens(self.config.reply_reuse, r.out_len)
            r.chain = reply_in_history(r.before_reply, r.reply_seg, r.out_len, reused, self._seg)
            r.before_reply = None
        self._seg += 1
        r.chain.append(self._seg, obs)
        r.prompt_len = total + obs
        host.call_at(host.now() + r.tools[k], partial(self._send, r))

    def _end(self, uid: int, r: _Rollout, how: SessionEnd, counter: str) -> None:
        host = self._host
        if host is None or r.state != _ACTIVE:
            return
        self.stats[counter] += 1
        if how == "completed":
            r.state = _DONE
        else:
            r.state = _CANCELLED
            if r.handle >= 0:
                host.cancel(r.handle)
                r.handle = -1
        del self._active[uid]
        now = host.now()
        host.end_session(r.sid, how)
        g = r.group
        g.open -= 1
        g.last_end_s = max(g.last_end_s, now)
        if g.open == 0:
            host.record_group(g.last_end_s - g.admit_s)
        r.chain = BlockChain(1)  # free the key lists
        r.before_reply = None
        if how == "completed":
            self._buffer.append(r)
            self._maybe_train()
        else:
            self._open -= 1
        self._admit()

    def _timeout(self, uid: int) -> None:
        r = self._active.get(uid)
        if r is not None:
            self._end(uid, r, "cancelled", "rollouts_timeout")

    def _maybe_train(self) -> None:
        host, c = self._host, self.config
        if host is None or self._trainer_busy or self._stopped:
            return
        oldest = self._version - c.max_off_policy_steps
        while self._buffer and self._buffer[0].version < oldest:
            self._buffer.popleft()
            self._open -= 1
            self.stats["rollouts_stale_discarded"] += 1
        if len(self._buffer) < c.batch_size:
            return
        for _ in range(c.batch_size):
            self._buffer.popleft()
        self._open -= c.batch_size
        self._trainer_busy = True
        host.call_at(host.now() + c.trainer_step_s, self._step_done)
        self._admit()

    def _step_done(self) -> None:
        host, c = self._host, self.config
        if host is None:
            return
        now = host.now()
        self._trainer_busy = False
        self._steps += 1
        self._version += 1
        host.record_step(self._steps, now - self._last_step_end)
        self._last_step_end = now
        if c.cache == "reset":
            host.reset_prefix_cache()
        if self._steps >= c.steps:
            self._stopped = True
            host.stop()
            return
        oldest = self._version - c.max_off_policy_steps
        stale = [(u, r) for u, r in self._active.items() if r.version < oldest]
        for u, r in stale:
            self._end(u, r, "cancelled", "rollouts_off_policy")
        self._maybe_train()
        self._admit()
