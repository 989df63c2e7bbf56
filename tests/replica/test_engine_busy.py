"""``busy_time_s`` counts only time already spent: never more than the time elapsed."""

from __future__ import annotations

import pytest

from sessionroute.replica import PROFILES, EngineRequest, Replica, ReplicaConfig, chain_block_keys

TOY = PROFILES["toy-8b-h100-tp1"]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
def test_busy_time_never_exceeds_elapsed_time(fast: bool) -> None:
    """A saturated replica sampled between step boundaries: each interval's busy seconds are
    at most the interval (the old counter added a step's whole duration at its start, so a
    sample inside a step read up to one step ahead: busy fractions above 1)."""
    rep = Replica(ReplicaConfig(profile=TOY, kv_capacity_tokens=65536), fast=fast)
    for i in range(48):
        tokens = [i * 100_000 + j for j in range(600 + 37 * i)]
        out = [7] * (200 + 11 * i)
        keys = chain_block_keys(tokens + out, 16)
        rep.add_request(EngineRequest(f"r{i}", len(tokens), len(out), keys), 0.0)
    prev_t, prev_busy = 0.0, 0.0
    t = 0.0
    over = 0
    while rep.next_event_time() is not None:
        t += 0.0037  # not a multiple of any step: most samples fall inside a step
        rep.advance(t)
        busy = rep.counters().busy_time_s
        if busy - prev_busy > (t - prev_t) + 1e-9:
            over += 1
        assert busy >= prev_busy
        prev_t, prev_busy = t, busy
    assert over == 0
    assert prev_busy <= t + 1e-9
    # saturated from 0 until the last finish: busy is nearly all of the elapsed time
    assert prev_busy > 0.9 * (t - 0.0037)
