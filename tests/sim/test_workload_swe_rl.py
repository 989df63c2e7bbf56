"""The swe-rl orchestrator against a small fake host (fixed response time, virtual time)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from sessionroute.errors import ConfigError
from sessionroute.workloads.base import Host, SessionEnd, Turn, TurnOutcome
from sessionroute.workloads.registry import workload_config
from sessionroute.workloads.swe_rl import SweRlWorkload
from sessionroute.workloads.swe_rl_config import SweRlConfig


class FakeHost(Host):
    """Answers every turn ``latency`` seconds after it is sent; records what it sees."""

    block_size = 16
    max_model_len = 131072

    def __init__(self, latency: float = 1.0) -> None:
        self.latency = latency
        self.t = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.turns: list[tuple[float, Turn]] = []
        self.live: dict[int, Turn] = {}
        self.cancelled: list[int] = []
        self.ended: list[tuple[str, SessionEnd]] = []
        self.steps: list[tuple[int, float]] = []
        self.groups: list[float] = []
        self.resets = 0
        self.stopped = False
        self.max_live_sessions = 0
        self._sessions: set[str] = set()

    def now(self) -> float:
        return self.t

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn))

    def submit(self, turn: Turn, on_done: Callable[[TurnOutcome], None]) -> int:
        self._seq += 1
        handle = self._seq
        self.turns.append((self.t, turn))
        self.live[handle] = turn
        self._sessions.add(turn.session_id)
        self.max_live_sessions = max(self.max_live_sessions, len(self._sessions))
        sent = self.t

        def done() -> None:
            if self.live.pop(handle, None) is not None:
                on_done(TurnOutcome(turn, sent, self.t, True, 0, 0))

        self.call_at(self.t + self.latency, done)
        return handle

    def cancel(self, handle: int) -> None:
        self.cancelled.append(handle)
        self.live.pop(handle, None)

    def end_session(self, session_id: str, how: SessionEnd) -> None:
        self.ended.append((session_id, how))
        self._sessions.discard(session_id)

    def reset_prefix_cache(self) -> None:
        self.resets += 1

    def record_step(self, step: int, step_time_s: float) -> None:
        self.steps.append((step, step_time_s))

    def record_group(self, latency_s: float) -> None:
        self.groups.append(latency_s)

    def stop(self) -> None:
        self.stopped = True

    def run(self, until: float = 1e9) -> None:
        while self._heap and not self.stopped:
            t, _, fn = heapq.heappop(self._heap)
            if t > until:
                break
            self.t = t
            fn()


SMALL: dict[str, Any] = {
    "steps": 3,
    "batch_size": 8,
    "group_size": 4,
    "async_level": 1,
    "trainer_step_s": 2.0,
    "turns_min": 1,
    "turns_p50": 3,
    "turns_p90": 5,
    "turns_p99": 6,
    "turns_max": 6,
    "tool_p50_s": 0.5,
    "tool_p90_s": 1.0,
    "tool_cap_s": 2.0,
}


def _start(latency: float = 1.0, **options: Any) -> tuple[SweRlWorkload, FakeHost]:
    w = SweRlWorkload(SweRlConfig(**{**SMALL, **options}), np.random.default_rng(0))
    host = FakeHost(latency)
    w.start(host)
    return w, host


def test_whole_groups_are_admitted_up_to_the_in_flight_bound() -> None:
    w, host = _start()
    first = [turn for t, turn in host.turns if t == 0.0]
    assert len(first) == 16  # batch 8 x (1 + async_level 1), in groups of 4
    host.run()
    s = w.summary()
    assert s["rollouts_started"] == 4 * s["groups_admitted"]
    assert host.max_live_sessions <= 16
    assert [k for k, _ in host.steps] == [1, 2, 3]
    assert host.stopped and w.progress() == 1.0
    assert len(host.groups) > 0 and all(g > 0 for g in host.groups)


def test_a_group_shares_its_task_and_everyone_shares_the_system_prompt() -> None:
    _, host = _start()
    first = [turn for t, turn in host.turns if t == 0.0]
    bs = host.block_size
    system = 6500 // bs
    g0, g1 = first[:4], first[4:8]
    prompt_blocks = g0[0].prompt_len // bs
    assert all(
        list(t.block_keys[:prompt_blocks]) == list(g0[0].block_keys[:prompt_blocks]) for t in g0
    )
    assert list(g1[0].block_keys[:system]) == list(g0[0].block_keys[:system])
    assert g1[0].block_keys[system + 1] != g0[0].block_keys[system + 1]  # different task
    # outputs differ inside a group: the first output block is private
    last = (g0[0].prompt_len + min(t.output_len for t in g0)) // bs - 1
    if last > prompt_blocks:
        assert len({t.block_keys[last] for t in g0}) == 4


def test_each_turn_extends_the_previous_one() -> None:
    _, host = _start()
    host.run()
    by_session: dict[str, list[Turn]] = {}
    for _, turn in host.turns:
        by_session.setdefault(turn.session_id, []).append(turn)
    for turns in by_session.values():
        for a, b in itertools.pairwise(turns):
            assert b.prompt_len > a.prompt_len + a.output_len - 1
            n = (a.prompt_len + a.output_len) // host.block_size
            assert list(b.block_keys[:n]) == list(a.block_keys[:n])


def test_salt_cache_uses_the_policy_version_of_each_rollout() -> None:
    _, host = _start(cache="salt")
    host.run()
    salts = {turn.cache_salt for _, turn in host.turns}
    assert {"v0", "v1"} <= salts and None not in salts
    assert host.resets == 0


def test_reset_cache_resets_every_replica_at_each_version_bump() -> None:
    _, host = _start(cache="reset")
    host.run()
    assert host.resets == 3
    assert {turn.cache_salt for _, turn in host.turns} == {None}


def test_the_rollout_timeout_cancels_in_flight_turns() -> None:
    w, host = _start(latency=10.0, rollout_timeout_s=15.0, turns_min=3, turns_p50=4)
    host.run(until=200.0)
    assert w.summary()["rollouts_timeout"] > 0
    assert host.cancelled
    assert ("rollout-1", "cancelled") in host.ended


def test_the_context_limit_ends_rollouts_and_is_never_exceeded() -> None:
    w, host = _start(context_limit=9000, turns_min=6, turns_p50=6, turns_p90=6, turns_p99=6)
    host.run()
    assert w.summary()["rollouts_context_limit"] > 0
    assert all(t.prompt_len + t.output_len <= 9000 for _, t in host.turns)


def test_the_off_policy_bound_cancels_stale_rollouts() -> None:
    w, host = _start(latency=5.0, max_off_policy_steps=0, trainer_step_s=0.1, steps=4, turns_min=1)
    host.run()
    assert w.summary()["rollouts_off_policy"] > 0


def test_options_are_validated_by_name() -> None:
    with pytest.raises(ConfigError, match="batch_sise"):
        workload_config("swe-rl", None, {"batch_sise": 3})
    with pytest.raises(ConfigError, match="turn quantiles"):
        workload_config("swe-rl", None, {"turns_p50": 90})
    cfg = workload_config("swe-rl", 7, {"steps": 3})
    assert isinstance(cfg, SweRlConfig) and cfg.steps == 7
