"""``reply_reuse``: the next prompt repeats only part of the previous reply token for token.

Exact key sequences for the toy and swe-rl workloads at reuse 1.0, 0.5 and 0, against chains
built by hand from the same segments, plus the replica model's hit accounting.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from sessionroute.keys import BlockChain
from sessionroute.workloads.base import Host, SessionEnd, Turn, TurnOutcome
from sessionroute.workloads.content import reply_in_history, reused_reply_tokens
from sessionroute.workloads.swe_rl_config import SweRlConfig
from sessionroute.workloads.toy import ToyConfig

BS = 16


class _Host(Host):
    """Answers every turn one second after it is sent, in virtual time; records the turns."""

    block_size = BS
    max_model_len = 100_000

    def __init__(self) -> None:
        self.t = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.turns: list[Turn] = []
        self.stopped = False

    def now(self) -> float:
        return self.t

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn))

    def submit(self, turn: Turn, on_done: Callable[[TurnOutcome], None]) -> int:
        # the keys are copied: the swe-rl workload hands over its chain's own list
        turn = turn._replace(block_keys=list(turn.block_keys))
        self.turns.append(turn)
        sent = self.t
        self.call_at(self.t + 1.0, lambda: on_done(TurnOutcome(turn, sent, self.t, True, 0, 0)))
        return self._seq

    def cancel(self, handle: int) -> None:
        pass

    def end_session(self, session_id: str, how: SessionEnd) -> None:
        pass

    def reset_prefix_cache(self) -> None:
        pass

    def record_step(self, step: int, step_time_s: float) -> None:
        pass

    def record_group(self, latency_s: float) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True

    def run(self) -> None:
        while self._heap and not self.stopped:
            self.t, _, fn = heapq.heappop(self._heap)
            fn()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize(
    ("reuse", "output", "reused"),
    [(1.0, 40, 40), (0.5, 40, 20), (0.0, 40, 0), (0.7, 10, 7), (0.5, 33, 16)],
)
def test_reused_reply_tokens(reuse: float, output: int, reused: int) -> None:
    assert reused_reply_tokens(reuse, output) == reused


def test_reused_reply_tokens_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="reply_reuse"):
        reused_reply_tokens(1.5, 10)
    with pytest.raises(ValueError, match="output_len"):
        reused_reply_tokens(0.5, -1)


# toy: system 100 tokens, first message 70, outputs 40, follow-ups 50, 3 turns, 1 session;
# segment ids: system 1, first message 2, then per turn the reply, (the re-rendered rest),
# the follow-up
_TOY: dict[str, Any] = {
    "sessions": 1,
    "turns_p50": 3,
    "turns_p90": 3,
    "turns_max": 3,
    "system_prompt_tokens": 100,
    "first_p50": 70,
    "first_p90": 70,
    "output_p50": 40,
    "output_p90": 40,
    "followup_p50": 50,
    "followup_p90": 50,
}


def _toy_expected(reused: int) -> list[list[int]]:
    """The keys of the three turns, built by hand."""
    chain = BlockChain(BS)
    chain.append(1, 100)
    chain.append(2, 70)
    seg = 2
    out: list[list[int]] = []
    for turn in range(3):
        before = chain.copy()
        seg += 1
        reply = seg
        chain.append(reply, 40)
        out.append(list(chain.keys))
        if turn == 2:
            break
        if reused < 40:
            seg += 1
            chain = reply_in_history(before, reply, 40, reused, seg)
        seg += 1
        chain.append(seg, 50)
    return out


@pytest.mark.parametrize(("reuse", "reused"), [(1.0, 40), (0.5, 20), (0.0, 0)])
def test_toy_keys_exact(reuse: float, reused: int) -> None:
    host = _Host()
    ToyConfig(**_TOY, reply_reuse=reuse).build(np.random.default_rng(3)).start(host)
    host.run()
    assert [t.prompt_len for t in host.turns] == [170, 260, 350]  # lengths never change
    assert [t.output_len for t in host.turns] == [40, 40, 40]
    expected = _toy_expected(reused)
    assert [list(t.block_keys) for t in host.turns] == expected
    # turn 2 shares exactly the blocks that end inside prompt 1 + the repeated reply tokens
    shared = _common_prefix(list(host.turns[1].block_keys), list(host.turns[0].block_keys))
    assert shared == (170 + reused) // BS
    assert len(host.turns[1].block_keys) == (260 + 40) // BS


def test_toy_default_is_full_reuse() -> None:
    assert ToyConfig().reply_reuse == 1.0
    with pytest.raises(ValidationError):
        ToyConfig(reply_reuse=1.2)
    with pytest.raises(ValidationError):
        SweRlConfig(reply_reuse=-0.1)


_SWE: dict[str, Any] = {
    "steps": 1,
    "batch_size": 1,
    "group_size": 1,
    "inflight_rollouts": 1,
    "turns_min": 3,
    "turns_p50": 3,
    "turns_p90": 3,
    "turns_p99": 3,
    "turns_max": 3,
    "system_prompt_tokens": 64,
    "task_tokens_p50": 80,
    "task_tokens_p90": 80,
    "output_p50": 48,
    "output_p90": 48,
    "observation_p50": 30,
    "observation_p90": 30,
    "trainer_step_s": 1.0,
}


@pytest.mark.parametrize(("reuse", "reused"), [(1.0, 48), (0.5, 24), (0.0, 0)])
def test_swe_rl_keys_exact(reuse: float, reused: int) -> None:
    host = _Host()
    SweRlConfig(**_SWE, reply_reuse=reuse).build(np.random.default_rng(5)).start(host)
    host.run()
    turns = host.turns[:3]
    assert [t.prompt_len for t in turns] == [144, 222, 300]
    # by hand: system (segment 1), task (2), then reply, (re-rendered rest), observation
    chain = BlockChain(BS)
    chain.append(1, 64)
    chain.append(2, 80)
    seg = 2
    for k, turn in enumerate(turns):
        before = chain.copy()
        seg += 1
        reply = seg
        chain.append(reply, 48)
        assert list(turn.block_keys) == chain.keys, f"turn {k + 1}"
        if reused < 48:
            seg += 1
            chain = reply_in_history(before, reply, 48, reused, seg)
        seg += 1
        chain.append(seg, 30)
    shared = _common_prefix(list(turns[1].block_keys), list(turns[0].block_keys))
    assert shared == (144 + reused) // BS


def test_reply_in_history_full_reuse_is_the_generated_chain() -> None:
    generated = BlockChain(BS)
    generated.append(1, 50)
    before = generated.copy()
    generated.append(2, 37)
    generated.append(4, 20)
    rebuilt = reply_in_history(before, 2, 37, 37, 3)
    rebuilt.append(4, 20)
    assert rebuilt.keys == generated.keys


def test_reply_in_history_refuses_more_than_the_reply() -> None:
    with pytest.raises(ValueError, match="reused"):
        reply_in_history(BlockChain(BS), 2, 10, 11, 3)


@pytest.mark.parametrize(("reuse", "reused"), [(1.0, 40), (0.5, 20), (0.0, 0)])
def test_replica_model_hits_only_the_repeated_part(reuse: float, reused: int) -> None:
    """One replica with room for everything: the hits of each later turn are the blocks of the
    previous prompt plus the repeated part of the reply, and nothing of the re-rendered rest."""
    from sessionroute.clock import ManualClock
    from sessionroute.sim import SimSpec, run_simulation

    spec = SimSpec.model_validate(
        {
            "workload": {"kind": "toy", "options": {**_TOY, "reply_reuse": reuse}},
            "replicas": {"count": 1, "block_size": BS, "kv_capacity_tokens": 65536},
        }
    )
    m = run_simulation(spec, "round_robin", wall_clock=ManualClock()).metrics
    # prompts 170, 260, 350; turn k + 1 hits the blocks ending inside prompt k + reused
    hits = ((170 + reused) // BS + (260 + reused) // BS) * BS
    assert m["prefix_cache_hit_rate"] == pytest.approx(hits / (170 + 260 + 350))
